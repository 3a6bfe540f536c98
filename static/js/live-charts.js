// Live GPU charts: one Plotly chart per metric, one trace per GPU, extended in place from the
// WebSocket (typed JSON from monitoring/live.py) and bounded to `window` points per trace.
(function () {
  "use strict";
  const root = document.getElementById("live");
  if (!root || !window.Plotly) return;
  const data = JSON.parse(document.getElementById("chart-data").textContent);
  const gpus = data.gpus;
  const indexOf = new Map(gpus.map((g, i) => [g.id, i]));
  const charts = Array.from(root.querySelectorAll(".chart"));
  const status = document.getElementById("live-status");

  for (const el of charts) {
    const metric = el.dataset.metric;
    const traces = gpus.map((g) => {
      const points = (data.history[g.id] || {})[metric] || [];
      return {x: points.map((p) => new Date(p[0] * 1000)), y: points.map((p) => p[1]), name: g.label,
              mode: "lines", type: "scatter"};
    });
    Plotly.newPlot(el, traces, {title: {text: el.dataset.title}, height: 260, margin: {l: 50, r: 10, t: 40, b: 30},
                                showlegend: gpus.length <= 16, xaxis: {type: "date"}},
                   {displaylogo: false, responsive: true});
  }

  // Each GPU's newest time drawn: an older sample (an agent's backlog resent after an outage, or two
  // web workers' pushes crossing) would draw its line back in time and put old values in the table.
  const newest = new Map(gpus.map((g) => {
    const points = Object.values(data.history[g.id] || {}).flat();
    return [g.id, points.length ? Math.max(...points.map((p) => p[0])) : -Infinity];
  }));

  function onSamples(msg) {
    const rows = msg.samples.filter((s) => indexOf.has(s.gpu) && s.t > newest.get(s.gpu));
    if (!rows.length) return;
    for (const s of rows) newest.set(s.gpu, s.t);
    const idx = rows.map((s) => indexOf.get(s.gpu));
    for (const el of charts) {
      const metric = el.dataset.metric;
      Plotly.extendTraces(el, {x: rows.map((s) => [new Date(s.t * 1000)]), y: rows.map((s) => [s[metric]])},
                          idx, data.window);
    }
    for (const s of rows) {
      // The pool page's GPU bars: the card's memory in use against the holders' parts.
      const used = document.querySelector(`.gpu-bar[data-gpu="${s.gpu}"] .mem-used`);
      if (used && s.mem_total) {
        used.style.width = `${Math.min(100, (100 * s.mem_used) / s.mem_total).toFixed(1)}%`;
        used.parentElement.title = `memory in use: ${s.mem_used} of ${s.mem_total} MiB`;
      }
      if (s.shares) showShares(s);
      const tr = document.querySelector(`#gpu-table tr[data-gpu="${s.gpu}"]`);
      if (!tr) continue;
      tr.querySelector('[data-f="util"]').textContent = s.util;
      tr.querySelector('[data-f="mem"]').textContent = `${s.mem_used} / ${s.mem_total}`;
      tr.querySelector('[data-f="temp"]').textContent = s.temp;
      // Whole watts and "pid (MiB MiB), ..." as the server renders them (templates/monitoring/_charts.html).
      tr.querySelector('[data-f="power"]').textContent = Math.round(s.power);
      const processes = tr.querySelector('[data-f="processes"]');
      if (processes && s.processes) {
        processes.textContent = s.processes.length
          ? s.processes.map(([pid, mem]) => `${pid} (${mem} MiB)`).join(", ") : "none";
      }
    }
  }

  // Each holder's memory in use against what its share allows (per-process memory the agent attributed to
  // the reservation): a thin line under its part of the bar, red when it uses more than its share, and the
  // figures in its line of the holders' list. Parts of other teams' reservations (no id shown) are left as they are.
  function showShares(s) {
    const bar = document.querySelector(`.gpu-bar[data-gpu="${s.gpu}"]`);
    if (!bar) return;
    const byReservation = new Map();
    for (const share of s.shares) {
      const sum = byReservation.get(share.reservation) || {allocated: 0, used: 0};
      sum.allocated += share.allocated;
      sum.used += share.used;
      byReservation.set(share.reservation, sum);
    }
    for (const [reservation, sum] of byReservation) {
      const over = sum.used > sum.allocated;
      const text = `uses ${sum.used} of ${sum.allocated} MiB`;
      for (const seg of bar.querySelectorAll(`.seg[data-reservation="${reservation}"]`)) {
        const line = seg.querySelector('.seg-used');
        if (!line) continue;
        line.style.width = `${sum.allocated ? Math.min(100, (100 * sum.used) / sum.allocated).toFixed(1) : 0}%`;
        line.classList.toggle('over', over);
        seg.title = text;
      }
      for (const li of bar.querySelectorAll(`ul.holders li[data-reservation="${reservation}"]`)) {
        let use = li.querySelector('.share-use');
        if (!use) {
          use = document.createElement('span');
          use.className = 'share-use';
          li.append(' · ', use);
        }
        use.textContent = text;
        use.classList.toggle('over', over);
      }
    }
  }

  let delay = 1000;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}${root.dataset.ws}`);
    ws.onopen = () => { status.textContent = "connected"; delay = 1000; };
    ws.onmessage = (event) => {
      const msg = JSON.parse(event.data);
      if (msg.type === "telemetry.samples") onSamples(msg);
      else if (msg.type === "alert.changed") status.textContent = `alert ${msg.alert.state}: ${msg.alert.rule} on ${msg.alert.subject}`;
    };
    ws.onclose = () => {
      status.textContent = "disconnected, retrying…";
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 30000);
    };
  }
  connect();
})();
