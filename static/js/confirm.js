// A form with data-confirm asks before it posts: accepted, it posts with confirm=yes and the view acts at
// once; without JavaScript the view answers a page that asks the same question (portal/views.py).
document.addEventListener("submit", (event) => {
  const form = event.target;
  if (!(form instanceof HTMLFormElement) || !form.dataset.confirm) return;
  if (!window.confirm(form.dataset.confirm)) {
    event.preventDefault();
    return;
  }
  let field = form.querySelector('input[name="confirm"]');
  if (!field) {
    field = document.createElement("input");
    field.type = "hidden";
    field.name = "confirm";
    form.appendChild(field);
  }
  field.value = "yes";
});

// A select marked data-autosubmit (the header's language switcher) posts its form when changed; without
// JavaScript the form's own button does.
document.addEventListener("change", (event) => {
  const select = event.target;
  if (select instanceof HTMLSelectElement && select.dataset.autosubmit !== undefined) select.form.requestSubmit();
});
