// The reserve page: a click (or Enter) on a slot of the availability timeline starts the reservation
// then, keeping its length when it had one (the form stays plain HTML without this).
(function () {
  // "When": the fields of a fixed window or of "as soon as it fits", the other set hidden (all show without JS).
  function showWhen() {
    const form = document.getElementById('reserve-form');
    const chosen = form && form.querySelector('[name=when]:checked');
    if (form) form.dataset.when = chosen ? chosen.value : 'window';
  }
  document.addEventListener('change', (event) => { if (event.target.name === 'when') showWhen(); });
  document.addEventListener('DOMContentLoaded', showWhen);
  showWhen();

  // What a card costs, in the amount fields' texts: the heaviest of the models ticked, of all the pool's
  // when none is (the server renders the same on the first paint; this keeps it true as boxes change).
  function cardWeight() {
    const boxes = Array.from(document.querySelectorAll('#reserve-form [name=gpu_models][data-ge]'));
    const ticked = boxes.filter((box) => box.checked);
    const weights = (ticked.length ? ticked : boxes).map((box) => parseFloat(box.dataset.ge)).filter(isFinite);
    return weights.length ? Math.max(...weights) : null;
  }
  // As the form writes GE: two decimals at most, no trailing zeros.
  const geWords = (value) => (value ? value.toFixed(2).replace(/0+$/, '').replace(/\.$/, '') : '0');
  function showGe() {
    const weight = cardWeight();
    if (weight === null) return;
    document.querySelectorAll('#reserve-form [data-ge-per-card]').forEach((el) => {
      const words = geWords(parseFloat(el.dataset.gePerCard) * weight);
      el.textContent = el.dataset.geLabel ? el.dataset.geLabel.replace('{ge}', words) : words;
    });
  }
  document.addEventListener('change', (event) => { if (event.target.name === 'gpu_models') showGe(); });

  function pick(slot) {
    const starts = document.querySelector('#reserve-form [name=starts_at]');
    const ends = document.querySelector('#reserve-form [name=ends_at]');
    if (!starts || !slot.dataset.start) return;
    // The fields hold wall-clock times of the page's zone ("2026-11-24 18:30"): the arithmetic reads them
    // as if they were UTC, which keeps the wall-clock length.
    const wall = (text) => Date.parse(text.trim().replace(' ', 'T') + 'Z');
    const before = starts.value ? wall(starts.value) : NaN;
    const length = ends && ends.value && !isNaN(before) ? wall(ends.value) - before : 0;
    starts.value = slot.dataset.start;
    if (ends) {
      const keep = length > 0 ? length : 2 * 3600 * 1000;
      ends.value = new Date(wall(slot.dataset.start) + keep).toISOString().slice(0, 16).replace('T', ' ');
    }
    const window_ = document.querySelector('#reserve-form [name=when][value=window]');
    if (window_ && !window_.checked) { window_.checked = true; showWhen(); }
    document.querySelectorAll('.timeline .slot.picked').forEach((s) => s.classList.remove('picked'));
    slot.classList.add('picked');
  }
  document.addEventListener('click', (event) => {
    const slot = event.target.closest('.timeline .slot[data-start]');
    if (slot) pick(slot);
  });
  document.addEventListener('keydown', (event) => {
    const slot = event.target.closest && event.target.closest('.timeline .slot[data-start]');
    if (slot && (event.key === 'Enter' || event.key === ' ')) { event.preventDefault(); pick(slot); }
  });
})();
