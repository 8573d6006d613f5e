// riverbed ui: draws charts with uPlot, tails logs, sizes bars. No inline script anywhere
// (the page's Content-Security-Policy is default-src 'self').
(function () {
  "use strict";
  var COLORS = ["#2b6cb0", "#2f855a", "#b7791f", "#6b46c1", "#c53030", "#319795", "#d53f8c", "#4a5568"];

  function sizeBars(root) {
    root.querySelectorAll("[data-width]").forEach(function (el) {
      el.style.width = el.getAttribute("data-width") + "%";
    });
  }

  // data-chart: {"title": "...", "series": [{"label": "...", "points": [[t, v], ...]}]}
  function drawCharts(root) {
    root.querySelectorAll("[data-chart]").forEach(function (el) {
      var spec;
      try { spec = JSON.parse(el.getAttribute("data-chart")); } catch (e) { return; }
      var first = spec.series[0] || { points: [] };
      if (first.points.length < 2) { el.textContent = "trend: collecting samples…"; return; }
      var xs = first.points.map(function (p) { return p[0]; });
      var data = [xs].concat(spec.series.map(function (s) { return s.points.map(function (p) { return p[1]; }); }));
      el.textContent = "";
      new uPlot({
        title: spec.title, width: Math.min(900, el.clientWidth || 900), height: 180,
        series: [{}].concat(spec.series.map(function (s, i) {
          return { label: s.label, stroke: COLORS[i % COLORS.length], width: 2 };
        })),
      }, data, el);
    });
  }

  // data-live: the stream page's results from state, per window, one line per key
  function drawLive(box) {
    var select = box.querySelector("select.metric");
    var chart = box.querySelector(".livechart");
    var note = box.querySelector(".live-note");
    var url = box.getAttribute("data-live");
    var last = null;
    function render() {
      if (!last) { return; }
      var metric = select.value;
      var band = last.error_bands[metric];
      var windows = Array.from(new Set(last.rows.map(function (r) { return r.window_start; }))).sort();
      var totals = {};
      last.rows.forEach(function (r) { totals[r.key] = (totals[r.key] || 0) + (Number(r[metric]) || 0); });
      var keys = Object.keys(totals).sort(function (a, b) { return totals[b] - totals[a]; }).slice(0, 8);
      var xs = windows.map(function (w) { return Date.parse(w) / 1000; });
      var series = [{}];
      var data = [xs];
      keys.forEach(function (k, i) {
        var byWindow = {};
        last.rows.forEach(function (r) { if (r.key === k) { byWindow[r.window_start] = Number(r[metric]); } });
        var values = windows.map(function (w) { return w in byWindow ? byWindow[w] : null; });
        series.push({ label: String(k), stroke: COLORS[i % COLORS.length], width: 2 });
        data.push(values);
        if (band) {
          series.push({ label: k + " −1σ", stroke: COLORS[i % COLORS.length], width: 1, dash: [4, 4] });
          data.push(values.map(function (v) { return v === null ? null : v * (1 - band); }));
          series.push({ label: k + " +1σ", stroke: COLORS[i % COLORS.length], width: 1, dash: [4, 4] });
          data.push(values.map(function (v) { return v === null ? null : v * (1 + band); }));
        }
      });
      chart.textContent = "";
      note.textContent = last.rows.length + " rows in state, " + windows.length + " windows; top " + keys.length +
        " keys by " + metric + (band ? " (HLL: ±" + (100 * band).toFixed(1) + "% at 1σ)" : " (exact)");
      if (xs.length === 0) { chart.textContent = last.note || "no windows in state yet"; return; }
      new uPlot({ width: Math.min(1000, chart.clientWidth || 1000), height: 300, series: series }, data, chart);
    }
    function load() {
      fetch(url, { credentials: "same-origin" }).then(function (r) { return r.json(); }).then(function (body) {
        if (body.error) { note.textContent = body.error; return; }
        if (select.options.length === 0) {
          body.metrics.forEach(function (m) { var o = document.createElement("option"); o.value = m; o.textContent = m; select.appendChild(o); });
        }
        last = body;
        render();
      }).catch(function (e) { note.textContent = "could not load live results: " + e; });
    }
    select.addEventListener("change", render);
    load();
    if (url.indexOf("batch=") < 0) { setInterval(load, 5000); }
  }

  // data-tail: append new log bytes; follow only when already at the bottom
  function tail(pre) {
    var url = pre.getAttribute("data-tail");
    var offset = 0;
    function more() {
      fetch(url + "?offset=" + offset, { credentials: "same-origin" }).then(function (r) { return r.json(); }).then(function (body) {
        if (!body.text) { return; }
        var atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        pre.appendChild(document.createTextNode(body.text));
        offset = body.next;
        if (atBottom) { pre.scrollTop = pre.scrollHeight; }
      }).catch(function () {});
    }
    more();
    setInterval(more, 1000);
  }

  function confirmActions(root) {
    root.querySelectorAll("form[data-confirm]").forEach(function (form) {
      form.addEventListener("submit", function (ev) {
        if (!window.confirm(form.getAttribute("data-confirm"))) { ev.preventDefault(); }
      });
    });
  }

  function refresh(root) { sizeBars(root); drawCharts(root); confirmActions(root); }

  document.addEventListener("DOMContentLoaded", function () {
    refresh(document);
    document.querySelectorAll("[data-live]").forEach(drawLive);
    document.querySelectorAll("pre[data-tail]").forEach(tail);
  });
  document.addEventListener("htmx:afterSwap", function (ev) {
    refresh(ev.detail.target);
    var stamp = document.getElementById("updated");
    if (stamp) { stamp.textContent = new Date().toISOString().replace("T", " ").slice(0, 19) + " UTC"; }
  });
})();
