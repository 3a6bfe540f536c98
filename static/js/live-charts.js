// GPU telemetry on the pool and node pages, drawn with Plotly and fed by the WebSocket (typed JSON from
// monitoring/live.py):
// - a heatmap of every GPU over time (one row per GPU), with a strip that marks the booked ones and
//   names the holder on hover: readable at 8 GPUs and at 200;
// - line charts per metric for the selected GPUs only (at most 10, one distinct colour each, listed in an
//   HTML legend that wraps instead of being clipped);
// - a range picker: live (the last `window` seconds, extended in place as samples arrive) or 1 h to 30 days
//   read from the history endpoint (minute and hour rollups).
(function () {
  "use strict";
  const root = document.getElementById("live");
  if (!root || !window.Plotly) return;
  const data = JSON.parse(document.getElementById("chart-data").textContent);
  // Every word this script writes, in the viewer's language, from the page (monitoring.views.chart_words):
  // "{name}" placeholders are filled in here, so a translation may put them in any order.
  const W = data.words;
  const fmt = (text, values) => text.replace(/\{(\w+)\}/g, (whole, key) => (key in values ? String(values[key]) : whole));
  const gpus = data.gpus;
  const byId = new Map(gpus.map((g) => [g.id, g]));
  const METRICS = ["util", "mem_used", "temp", "power", "sm_clock"];
  // A live sample names the SM clock as agents send it; null where the source does not report it.
  const value = (s, metric) => (metric === "sm_clock" ? s.sm_clock_mhz ?? null : s[metric]);
  const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                   "#bcbd22", "#17becf"];
  // Resized by the handler below, on width changes only: Plotly's own `responsive` also redraws on height
  // changes (a full-page screenshot, a phone's toolbar sliding away), where it could log axis-scaling errors.
  // Plotly's own words and date axes in the page's language (zh-CN registered by plotly-locale-zh-cn.js).
  const CONFIG = {displaylogo: false, locale: document.documentElement.lang === "zh-hans" ? "zh-CN" : "en"};
  const charts = Array.from(root.querySelectorAll(".chart"));
  const heatmap = document.getElementById("chart-heatmap");
  const status = document.getElementById("live-status");
  const note = document.getElementById("range-note");
  const legend = document.getElementById("chart-legend");
  const buttons = Array.from(root.querySelectorAll(".range-picker button"));

  function holderText(g) {
    if (!g.holders.length) return W.free;
    return g.holders.map((h) => (h.reservation ? `${h.team} #${h.reservation}` : h.team) + ` (${h.part})`).join(", ");
  }

  // The live points of each GPU: whole seconds and each metric, at most `window` of them.
  const live = new Map(gpus.map((g) => {
    const h = data.history[g.id] || {};
    const series = {t: (h.util || []).map((p) => p[0])};
    for (const m of METRICS) series[m] = (h[m] || []).map((p) => p[1]);
    return [g.id, series];
  }));
  // Each GPU's newest time received: an older sample (an agent's backlog resent after an outage, or two
  // web workers' pushes crossing) would draw its line back in time and put old values in the table.
  const newest = new Map(gpus.map((g) => {
    const t = live.get(g.id).t;
    return [g.id, t.length ? t[t.length - 1] : -Infinity];
  }));

  // What the charts show: the live points, or a range read from the history endpoint.
  let view = {range: "live", source: live};
  // The GPUs drawn as lines, each with its colour (kept while it stays selected).
  const colourOf = new Map();
  for (const g of gpus.slice(0, 8)) colourOf.set(g.id, COLOURS[colourOf.size]);

  function selected() { return gpus.filter((g) => colourOf.has(g.id)); }

  function toggle(id) {
    if (colourOf.has(id)) colourOf.delete(id);
    else if (colourOf.size < COLOURS.length) {
      const used = new Set(colourOf.values());
      colourOf.set(id, COLOURS.find((c) => !used.has(c)));
    } else {
      legend.dataset.full = "true";
    }
    drawLines();
  }

  function lineTraces(metric) {
    return selected().map((g) => {
      const s = view.source.get(g.id) || {t: [], [metric]: []};
      return {x: s.t.map((t) => new Date(t * 1000)), y: s[metric].slice(), name: g.label, type: "scatter",
              mode: "lines", line: {color: colourOf.get(g.id), width: 1.6},
              hovertemplate: `${g.label} · ${holderText(g)}<br>%{x}<br>%{y}<extra></extra>`};
    });
  }

  function drawLines() {
    for (const el of charts) {
      Plotly.react(el, lineTraces(el.dataset.metric),
                   {title: {text: el.dataset.title, font: {size: 14}}, height: 250, showlegend: false,
                    margin: {l: 50, r: 10, t: 36, b: 30}, xaxis: {type: "date"}}, CONFIG);
    }
    const chosen = selected();
    legend.replaceChildren(...chosen.map((g) => {
      const item = document.createElement("span");
      item.className = "legend-item";
      item.dataset.gpu = g.id;
      const swatch = document.createElement("span");
      swatch.className = "swatch-line";
      swatch.style.background = colourOf.get(g.id);
      item.append(swatch, `${g.label} (${holderText(g)})`);
      return item;
    }));
    if (!chosen.length) legend.textContent = W.no_selection;
    else if (legend.dataset.full === "true") legend.append(` · ${W.full}`);
    delete legend.dataset.full;
    for (const box of document.querySelectorAll("#gpu-table input[data-pick]")) {
      const id = Number(box.dataset.pick);
      box.checked = colourOf.has(id);
      const cell = box.parentElement;
      cell.style.boxShadow = colourOf.has(id) ? `inset 4px 0 0 ${colourOf.get(id)}` : "";
    }
  }

  // The heatmap's columns: every second of the live window, or every bucket of the range.
  function columns() {
    if (view.range === "live") {
      let end = Math.floor(Date.now() / 1000);
      for (const t of newest.values()) if (t > end) end = Math.floor(t);
      const out = [];
      for (let t = end - data.window + 1; t <= end; t++) out.push(t);
      return out;
    }
    const out = [];
    for (let t = view.start - (view.start % view.step); t <= view.end; t += view.step) out.push(t);
    return out;
  }

  function rowLabel(g) {
    // On a phone the labels would take half the width: the booked strip and the hover name the holder.
    if (!g.holders.length || root.clientWidth < 600) return g.label;
    const teams = [...new Set(g.holders.map((h) => h.team))].join(", ");
    return `${g.label} · ${teams.length > 14 ? teams.slice(0, 13) + "…" : teams}`;
  }

  function drawHeatmap() {
    const cols = columns();
    const at = new Map(cols.map((t, j) => [t, j]));
    const z = gpus.map((g) => {
      const row = new Array(cols.length).fill(null);
      const s = view.source.get(g.id);
      if (s) s.t.forEach((t, k) => {
        const j = at.get(Math.floor(t));
        if (j !== undefined) row[j] = s.util[k];
      });
      return row;
    });
    const labels = gpus.map(rowLabel);
    const holders = gpus.map((g) => holderText(g));
    const dense = gpus.length > 24;
    const traces = [
      {type: "heatmap", x: ["booked"], y: labels, z: gpus.map((g) => [g.holders.length ? 1 : 0]), xaxis: "x2",
       zmin: 0, zmax: 1, showscale: false, colorscale: [[0, "#eef2f8"], [1, "#2f6fde"]], ygap: dense ? 0 : 1,
       text: holders.map((h) => [h]), hovertemplate: "%{y}<br>%{text}<extra></extra>"},
      {type: "heatmap", x: cols.map((t) => new Date(t * 1000)), y: labels, z, zmin: 0, zmax: 100,
       colorscale: "Viridis", ygap: dense ? 0 : 1, hoverongaps: false, colorbar: {thickness: 8, len: 1, title: {text: "%"}},
       text: holders.map((h) => new Array(cols.length).fill(h)),
       hovertemplate: `%{y}<br>%{text}<br>%{x}<br>${fmt(W.hover_util, {value: "%{z}"})}<extra></extra>`},
    ];
    const height = Math.min(900, Math.max(200, 70 + gpus.length * (dense ? 4 : 24)));
    Plotly.react(heatmap, traces, {
      title: {text: heatmap.dataset.title, font: {size: 14}}, height, margin: {l: 10, r: 10, t: 36, b: 36},
      xaxis: {type: "date", domain: [0.05, 1]}, xaxis2: {domain: [0, 0.035], showticklabels: false, fixedrange: true},
      yaxis: {type: "category", autorange: "reversed", automargin: true, anchor: "x2", tickfont: {size: 10}},
    }, CONFIG);
  }

  let heatmapDue = false;
  function heatmapSoon() {
    if (heatmapDue) return;
    heatmapDue = true;
    setTimeout(() => { heatmapDue = false; if (view.range === "live") drawHeatmap(); }, 1000);
  }

  function stepWords(step) {
    if (step % 86400 === 0) return step === 86400 ? W.day : fmt(W.days, {n: step / 86400});
    if (step % 3600 === 0) return step === 3600 ? W.hour : fmt(W.hours, {n: step / 3600});
    if (step % 60 === 0) return step === 60 ? W.minute : fmt(W.minutes, {n: step / 60});
    return fmt(W.seconds, {n: step});
  }

  let asked = 0;
  async function showRange(range, label) {
    for (const b of buttons) b.setAttribute("aria-pressed", String(b.dataset.range === range));
    const mine = ++asked;
    if (range === "live") {
      view = {range: "live", source: live};
      note.textContent = fmt(W.live_note, {window: data.window});
    } else {
      note.textContent = fmt(W.loading, {range: label});
      let body;
      try {
        const response = await fetch(`${data.history_url}?range=${encodeURIComponent(range)}`,
                                      {headers: {Accept: "application/json"}, credentials: "same-origin"});
        if (!response.ok) throw new Error(fmt(W.answered, {status: response.status}));
        body = await response.json();
      } catch (error) {
        if (mine === asked) note.textContent = fmt(W.load_failed, {range: label, error: error.message});
        return;
      }
      if (mine !== asked) return;  // another range was picked meanwhile
      const source = new Map();
      for (const g of body.gpus) {
        const series = {t: (g.util || []).map((p) => p[0])};
        for (const m of METRICS) series[m] = (g[m] || []).map((p) => (p[1] === null ? null : Math.round(p[1] * 10) / 10));
        source.set(g.gpu, series);
      }
      view = {range, source, start: body.start, end: body.end, step: body.step};
      note.textContent = fmt(W.range_note, {range: label, step: stepWords(body.step),
                                             resolution: W.resolutions[body.resolution] || body.resolution});
    }
    root.dataset.range = range;
    drawHeatmap();
    drawLines();
  }

  function onSamples(msg) {
    const rows = msg.samples.filter((s) => byId.has(s.gpu) && s.t > newest.get(s.gpu));
    if (!rows.length) return;
    for (const s of rows) {
      newest.set(s.gpu, s.t);
      const series = live.get(s.gpu);
      series.t.push(s.t);
      for (const m of METRICS) series[m].push(value(s, m));
      if (series.t.length > data.window) {
        series.t.shift();
        for (const m of METRICS) series[m].shift();
      }
    }
    if (view.range === "live") {
      const order = selected().map((g) => g.id);
      const drawn = rows.filter((s) => colourOf.has(s.gpu));
      if (drawn.length) {
        const idx = drawn.map((s) => order.indexOf(s.gpu));
        for (const el of charts) {
          const metric = el.dataset.metric;
          Plotly.extendTraces(el, {x: drawn.map((s) => [new Date(s.t * 1000)]), y: drawn.map((s) => [value(s, metric)])},
                              idx, data.window);
        }
      }
      heatmapSoon();
    }
    for (const s of rows) {
      // The pool page's GPU bars: the card's memory in use against the holders' parts.
      const used = document.querySelector(`.gpu-bar[data-gpu="${s.gpu}"] .mem-used`);
      if (used && s.mem_total) {
        used.style.width = `${Math.min(100, (100 * s.mem_used) / s.mem_total).toFixed(1)}%`;
        used.parentElement.title = fmt(W.memory_in_use, {used: s.mem_used, total: s.mem_total});
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
          ? s.processes.map(([pid, mem]) => `${pid} (${mem} MiB)`).join(", ") : W.none;
      }
      // Health figures come only from sources that report them (absent: "–").
      tr.querySelector('[data-f="sm_clock"]').textContent = s.sm_clock_mhz ?? "–";
      const ecc = tr.querySelector('[data-f="ecc"]');
      ecc.textContent = s.ecc_corrected == null && s.ecc_uncorrected == null ? "–"
        : `${s.ecc_corrected ?? "–"} / ${s.ecc_uncorrected ?? "–"}`;
      ecc.classList.toggle("warn", Boolean(s.ecc_uncorrected));
      const xid = tr.querySelector('[data-f="xid"]');
      xid.textContent = s.xid ?? "–";
      xid.classList.toggle("warn", Boolean(s.xid));
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
      const text = fmt(W.share_use, {used: sum.used, allocated: sum.allocated});
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
    ws.onopen = () => { status.textContent = W.connected; delay = 1000; };
    ws.onmessage = (event) => {
      const msg = JSON.parse(event.data);
      if (msg.type === "telemetry.samples") onSamples(msg);
      else if (msg.type === "alert.changed") {
        status.textContent = fmt(W.alert, {state: W.states[msg.alert.state] || msg.alert.state, rule: msg.alert.rule,
                                           subject: msg.alert.subject});
      }
    };
    ws.onclose = () => {
      status.textContent = W.disconnected;
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 30000);
    };
  }

  for (const b of buttons) b.addEventListener("click", () => showRange(b.dataset.range, b.textContent.trim()));
  for (const box of document.querySelectorAll("#gpu-table input[data-pick]")) {
    box.addEventListener("change", () => toggle(Number(box.dataset.pick)));
  }
  drawHeatmap();
  drawLines();
  let drawnWidth = root.clientWidth;
  let resizeDue = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeDue);
    resizeDue = setTimeout(() => {
      if (root.clientWidth === drawnWidth) return;
      drawnWidth = root.clientWidth;
      drawHeatmap();  // its labels depend on the width
      for (const el of [heatmap, ...charts]) Plotly.Plots.resize(el);
    }, 200);
  });
  heatmap.on("plotly_click", (event) => {
    const point = event.points && event.points[0];
    if (!point) return;
    const row = Array.isArray(point.pointIndex) ? point.pointIndex[0] : point.pointNumber[0];
    if (gpus[row]) toggle(gpus[row].id);
  });
  connect();
})();
