// A button marked data-print prints the page (the statement): the print stylesheet lays it out for A4.
document.addEventListener("click", (event) => {
  if (event.target instanceof Element && event.target.closest("[data-print]")) window.print();
});
