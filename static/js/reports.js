// The Reports page's charts (accounting/templates/accounting/reports.html): each draws its table from
// #report-data, the very rows its "CSV" link downloads. Words come from #report-words (the page's language).
(() => {
  const tables = JSON.parse(document.getElementById("report-data").textContent);
  const words = JSON.parse(document.getElementById("report-words").textContent);
  const CONFIG = {displaylogo: false, responsive: true,
                  locale: document.documentElement.lang === "zh-hans" ? "zh-CN" : "en"};
  const LAYOUT = {margin: {l: 56, r: 12, t: 8, b: 48}, legend: {orientation: "h", y: -0.2}, font: {size: 12}};

  const column = (table, name) => table.rows.map((row) => row[table.header.indexOf(name)]);
  const unique = (values) => [...new Set(values)];

  const charts = {
    ge_hours_by_team(table) {
      const months = unique(column(table, "month")).sort();
      return {
        data: unique(column(table, "team")).map((team) => ({
          type: "bar", name: team, x: months,
          y: months.map((month) => {
            const row = table.rows.find((r) => r[0] === month && r[1] === team);
            return row ? row[2] : 0;
          }),
        })),
        layout: {barmode: "stack", yaxis: {title: {text: words.ge_hours}}, xaxis: {type: "category"}},
      };
    },
    efficiency(table) {
      return {
        data: [{type: "bar", x: column(table, "team"), y: column(table, "efficiency"), name: words.efficiency}],
        layout: {yaxis: {title: {text: words.efficiency}, tickformat: ".0%", rangemode: "tozero"}},
      };
    },
    idle(table) {
      return {
        data: [{type: "bar", name: words.idle, x: column(table, "team"), y: column(table, "idle_ge_hours")},
               {type: "bar", name: words.no_data, x: column(table, "team"), y: column(table, "no_data_ge_hours")}],
        layout: {barmode: "stack", yaxis: {title: {text: words.ge_hours}}},
      };
    },
    top_holders(table) {
      return {
        data: [{type: "bar", orientation: "h", name: words.booked, y: column(table, "user"),
                x: column(table, "booked_ge_hours")},
               {type: "bar", orientation: "h", name: words.used, y: column(table, "user"),
                x: column(table, "used_ge_hours")}],
        layout: {yaxis: {autorange: "reversed", automargin: true}, xaxis: {title: {text: words.ge_hours}}},
      };
    },
    quota(table) {
      const labels = table.rows.map((row) => `${row[0]} / ${row[1]}`);
      return {
        data: [{type: "bar", name: words.booked_this_month, x: labels, y: column(table, "booked_ge_hours")},
               {type: "scatter", mode: "markers", name: words.budget, x: labels, y: column(table, "ge_hours_per_month"),
                marker: {symbol: "line-ew-open", size: 28, line: {width: 3}}}],
        layout: {yaxis: {title: {text: words.ge_hours}, rangemode: "tozero"}},
      };
    },
  };

  function draw() {
    for (const element of document.querySelectorAll("[data-chart]")) {
      const table = tables[element.dataset.chart];
      if (!table.rows.length) {
        element.textContent = words.nothing;
        element.classList.add("muted");
        element.style.height = "auto";
        continue;
      }
      const {data, layout} = charts[element.dataset.chart](table);
      window.Plotly.newPlot(element, data, {...LAYOUT, ...layout}, CONFIG);
    }
  }

  // A month picked in the filters redraws the page as a changed select does (data-autosubmit, confirm.js).
  document.addEventListener("change", (event) => {
    if (event.target instanceof HTMLInputElement && event.target.dataset.autosubmitInput !== undefined) {
      event.target.form.requestSubmit();
    }
  });
  if (window.Plotly) draw(); else window.addEventListener("load", draw);
})();
