// The goodput dashboard: polls the admin JSON API and draws everything in plain SVG.
// With an admin token, the token lives in this tab's sessionStorage and goes out only as
// an Authorization header; it never appears in a URL.
"use strict";
(function () {
  const POLL_MS = 2000;
  const TOKEN_KEY = "goodput.admin.token";
  const SVG = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);
  const state = { summary: null, timer: null, polls: 0 };
  window.goodputDashboard = state;

  // ---- formatting -------------------------------------------------------------------
  function num(v, digits) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    const d = digits === undefined ? (Math.abs(v) >= 100 ? 0 : Math.abs(v) >= 10 ? 1 : 2) : digits;
    return v.toLocaleString("en-US", { minimumFractionDigits: d, maximumFractionDigits: d });
  }
  const int = (v) => (v === null || v === undefined ? "–" : Math.round(v).toLocaleString("en-US"));
  const pct = (v) => (v === null || v === undefined ? "–" : num(v * 100, v >= 0.9995 || v === 0 ? 1 : 2) + " %");
  function ms(v) {
    if (v === null || v === undefined) return "–";
    return v >= 10000 ? num(v / 1000, 1) + " s" : v >= 1000 ? num(v / 1000, 2) + " s" : num(v, v >= 100 ? 0 : 1) + " ms";
  }
  function path(obj, key) {
    return key.split(".").reduce((o, k) => (o === null || o === undefined ? undefined : o[k]), obj);
  }
  function fmtKey(key, v, unit) {
    if (unit === "%") return pct(v);
    if (/requests$|slo_met$|slo_missed$|peak$|concurrency$/.test(key)) return int(v);
    return num(v);
  }
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      // Styles through the CSSOM: the page's CSP allows no inline style attributes.
      if (k === "class") e.className = v; else if (k === "style") Object.assign(e.style, v); else e.setAttribute(k, v);
    }
    for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    return e;
  }
  function empty(container, text) {
    container.replaceChildren(el("div", { class: "empty" }, text));
  }

  // ---- API --------------------------------------------------------------------------
  class Unauthorized extends Error {}
  async function api(p, allow404) {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    const resp = await fetch(p, { headers, cache: "no-store", credentials: "omit" });
    if (resp.status === 401) throw new Unauthorized();
    if (allow404 && resp.status === 404) return null;
    if (!resp.ok) throw new Error(p + ": HTTP " + resp.status);
    return resp.json();
  }

  // ---- charts -----------------------------------------------------------------------
  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  }
  // An axis from 0: a round step (1, 2, 2.5 or 5 × 10^k) giving at most 5 intervals.
  function axisScale(v) {
    if (!(v > 0)) return { top: 1, step: 0.25 };
    const raw = v / 5, p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * p).find((m) => m >= raw);
    return { top: Math.ceil(v / step - 1e-9) * step, step };
  }
  function tick(v) {
    return v >= 1000 ? num(v / 1000, v >= 10000 ? 0 : 1) + "k" : num(v, v >= 10 || v === 0 ? 0 : 1);
  }
  // series: [{name, color, points: [[x, y|null]...], dots?}]; opts: {xLabel, xFmt, marks: [{x, label, color}]}
  function lineChart(container, series, opts) {
    const W = 640, H = 220, L = 48, R = 12, T = 22, B = 26;
    const xs = series.flatMap((s) => s.points.map((p) => p[0]));
    const ys = series.flatMap((s) => s.points.map((p) => p[1]).filter((y) => y !== null && isFinite(y)));
    if (!ys.length) { empty(container, opts.emptyText || "no data yet"); return; }
    let x0 = Math.min(...xs), x1 = Math.max(...xs);
    if (opts.xMin !== undefined) x0 = Math.min(x0, opts.xMin);
    if (opts.xMax !== undefined) x1 = Math.max(x1, opts.xMax);
    if (x1 === x0) x1 = x0 + 1;
    const { top: y1, step } = axisScale(Math.max(...ys));
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => H - B - (y / y1) * (H - T - B);
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img", "data-points": String(ys.length) });
    const axis = svg("g", { class: "axis" });
    for (let y = 0; y <= y1 + step / 2; y += step) {
      axis.append(svg("line", { class: "grid-line", x1: L, x2: W - R, y1: sy(y), y2: sy(y) }));
      const t = svg("text", { x: L - 6, y: sy(y) + 4, "text-anchor": "end" }); t.textContent = tick(y); axis.append(t);
    }
    const xt = opts.xInt
      ? Array.from({ length: Math.floor((x1 - x0) / Math.max(1, Math.ceil((x1 - x0) / 8))) + 1 }, (_, i) => x0 + i * Math.max(1, Math.ceil((x1 - x0) / 8)))
      : [0, 1, 2, 3, 4].map((i) => x0 + ((x1 - x0) * i) / 4);
    xt.forEach((x, i) => {
      const t = svg("text", { x: sx(x), y: H - 8, "text-anchor": i === 0 ? "start" : i === xt.length - 1 && !opts.xInt ? "end" : "middle" });
      t.textContent = opts.xFmt ? opts.xFmt(x) : int(x); axis.append(t);
    });
    root.append(axis);
    for (const m of opts.marks || []) {
      root.append(svg("line", { x1: sx(m.x), x2: sx(m.x), y1: T, y2: H - B, stroke: m.color, "stroke-dasharray": "4 3", "stroke-width": 1.5 }));
      const right = sx(m.x) > W - 140;
      const t = svg("text", { x: sx(m.x) + (right ? -4 : 4), y: T + 10 + 13 * (m.row || 0), fill: m.color, "font-size": 11, "text-anchor": right ? "end" : "start" });
      t.textContent = m.label; root.append(t);
    }
    for (const s of series) {
      let d = "", pen = false;
      for (const [x, y] of s.points) {
        if (y === null || !isFinite(y)) { pen = false; continue; }
        d += (pen ? "L" : "M") + sx(x).toFixed(1) + " " + sy(y).toFixed(1) + " ";
        pen = true;
      }
      if (d) root.append(svg("path", { d, fill: "none", stroke: s.color, "stroke-width": 2, "stroke-linejoin": "round", "vector-effect": "non-scaling-stroke" }));
      if (s.dots) for (const [x, y, c] of s.points) if (y !== null) root.append(svg("circle", { cx: sx(x), cy: sy(y), r: 4, fill: c || s.color }));
    }
    const legend = svg("g", { class: "legend" });
    let lx = L;
    for (const s of series) {
      legend.append(svg("rect", { x: lx, y: 6, width: 10, height: 10, rx: 2, fill: s.color }));
      const t = svg("text", { x: lx + 14, y: 15 }); t.textContent = s.name; legend.append(t);
      lx += 22 + s.name.length * 6.5;
    }
    root.append(legend);
    container.replaceChildren(root);
  }
  function barChart(container, groups, series) {
    const W = 640, H = 220, L = 48, R = 12, T = 22, B = 26;
    const vals = groups.flatMap((g) => g.values.filter((v) => v !== null));
    if (!vals.length) { empty(container, "no TTFT samples in the window"); return; }
    const { top: y1, step } = axisScale(Math.max(...vals));
    const sy = (y) => H - B - (y / y1) * (H - T - B);
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img", "data-points": String(vals.length) });
    const axis = svg("g", { class: "axis" });
    for (let y = 0; y <= y1 + step / 2; y += step) {
      axis.append(svg("line", { class: "grid-line", x1: L, x2: W - R, y1: sy(y), y2: sy(y) }));
      const t = svg("text", { x: L - 6, y: sy(y) + 4, "text-anchor": "end" }); t.textContent = tick(y); axis.append(t);
    }
    const gw = (W - L - R) / groups.length, bw = Math.min(28, (gw - 16) / series.length);
    groups.forEach((g, i) => {
      const cx = L + gw * i + gw / 2;
      const t = svg("text", { x: cx, y: H - 8, "text-anchor": "middle" });
      t.textContent = g.label + (g.count ? ` (${int(g.count)})` : " (none)"); axis.append(t);
      g.values.forEach((v, j) => {
        if (v === null) return;
        const x = cx - (bw * series.length) / 2 + j * bw;
        root.append(svg("rect", { x: x + 1, y: sy(v), width: bw - 2, height: Math.max(1, H - B - sy(v)), fill: series[j].color, rx: 2 }));
      });
    });
    root.append(axis);
    const legend = svg("g", { class: "legend" });
    series.forEach((s, i) => {
      legend.append(svg("rect", { x: L + i * 60, y: 6, width: 10, height: 10, rx: 2, fill: s.color }));
      const t = svg("text", { x: L + i * 60 + 14, y: 15 }); t.textContent = s.name; legend.append(t);
    });
    root.append(legend);
    container.replaceChildren(root);
  }

  // ---- sections ---------------------------------------------------------------------
  const C = { a: "#4c9aff", b: "#a78bfa", c: "#f08c4a", good: "#3fb97d", bad: "#e5534b", muted: "#8592a3" };

  function renderSummary(s, cap) {
    $("window-label").textContent = "window " + s.window;
    for (const node of document.querySelectorAll("[data-key]")) {
      node.textContent = fmtKey(node.dataset.key, path(s, node.dataset.key), node.dataset.unit);
    }
    const o = s.overall;
    const att = $("kpi-attainment");
    att.classList.toggle("pass", o.attainment !== null && o.attainment_target !== null && o.attainment >= o.attainment_target);
    att.classList.toggle("fail", o.attainment !== null && o.attainment_target !== null && o.attainment < o.attainment_target);
    $("kpi-attainment-foot").textContent = o.attainment_target === null ? "no verdicts yet" : "target " + pct(o.attainment_target);
    const gp = $("kpi-goodput");
    gp.classList.toggle("pass", o.raw_output_tokens_per_s > 0 && o.effective_goodput_tokens_per_s >= 0.95 * o.raw_output_tokens_per_s);
    gp.classList.toggle("fail", o.raw_output_tokens_per_s > 0 && o.effective_goodput_tokens_per_s < 0.95 * o.raw_output_tokens_per_s);
    const errs = $("kpi-errors");
    errs.classList.toggle("fail", o.error_rate_holds === false || (o.error_rate || 0) > 0.05);
    errs.classList.toggle("pass", o.error_rate_holds === true || o.error_rate === 0);
    if (o.cost) {
      $("kpi-cost").textContent = (o.cost_per_million_effective_tokens === null ? "–" : num(o.cost_per_million_effective_tokens)) + " " + o.cost.currency;
      $("kpi-cost-foot").textContent = num(o.cost.per_hour) + " " + o.cost.currency + "/h · wasted " + pct(o.cost.wasted_share);
    }
    $("kpi-knee").textContent = "knee " + (cap && cap.knee !== null ? int(cap.knee) : "–") + (cap ? " · over " + cap.window : "");
    const body = $("classes");
    body.replaceChildren();
    for (const g of s.classes) {
      const ok = g.attainment === null || g.attainment_target === null ? null : g.attainment >= g.attainment_target;
      const bar = el("div", { class: "bar" });
      if (g.attainment !== null) bar.append(el("div", { class: "fill " + (ok ? "good" : "bad"), style: { width: (g.attainment * 100).toFixed(2) + "%" } }));
      if (g.attainment_target !== null) bar.append(el("div", { class: "target", style: { left: (g.attainment_target * 100).toFixed(2) + "%" }, title: "target" }));
      bar.append(el("span", { class: "txt" }, g.attainment === null ? "no verdicts" : pct(g.attainment) + " / " + pct(g.attainment_target)));
      const targets = el("td");
      for (const t of g.percentile_targets || []) {
        const label = `${t.metric} p${Math.round(t.quantile * 100)} ≤ ${ms(t.max_ms)}`;
        targets.append(el("span", { class: "tag " + (t.holds === false ? "bad" : t.holds === true ? "good" : "muted") }, label));
      }
      if (g.error_rate_max !== null) targets.append(el("span", { class: "tag " + (g.error_rate_holds === false ? "bad" : "good") }, "errors ≤ " + pct(g.error_rate_max)));
      if (!targets.childNodes.length) targets.append(el("span", { class: "muted" }, "–"));
      body.append(el("tr", { "data-class": g.name },
        el("td", {}, g.name), el("td", {}, int(g.requests)), el("td", {}, bar),
        el("td", {}, ms(g.ttft_ms.p95)), el("td", {}, ms(g.tpot_ms.p95)),
        el("td", {}, num(g.effective_goodput_tokens_per_s) + " tok/s"), targets));
    }
    const buckets = Object.entries(o.ttft_ms_by_input || {});
    barChart($("chart-input"), buckets.map(([label, p]) => ({ label, count: p.count, values: [p.p50, p.p95, p.p99] })),
      [{ name: "p50", color: C.a }, { name: "p95", color: C.b }, { name: "p99", color: C.c }]);
  }

  function renderTimeline(t) {
    const pts = t.points;
    const xFmt = (x) => (x >= 0 ? "now" : "-" + (x <= -120 ? num(-x / 60, 0) + "m" : num(-x, 0) + "s"));
    const x = (p) => -p.ended_s_ago;
    // At least two minutes wide, so a fresh start does not stretch two points over the chart.
    const oldest = pts.length ? pts[0].ended_s_ago + pts[0].duration_s : 0;
    const span = { xFmt, xMin: -Math.max(120, oldest), xMax: 0 };
    lineChart($("chart-goodput"), [
      { name: "raw", color: C.muted, points: pts.map((p) => [x(p), p.raw_output_tokens_per_s]) },
      { name: "effective", color: C.good, points: pts.map((p) => [x(p), p.effective_goodput_tokens_per_s]) },
    ], Object.assign({ emptyText: "no closed " + num(t.slice_seconds, 0) + " s slice yet" }, span));
    for (const [id, key] of [["chart-ttft", "ttft_ms"], ["chart-tpot", "tpot_ms"], ["chart-itl", "itl_ms"]]) {
      lineChart($(id), [
        { name: "p50", color: C.a, points: pts.map((p) => [x(p), p[key].p50]) },
        { name: "p90", color: C.b, points: pts.map((p) => [x(p), p[key].p90]) },
        { name: "p99", color: C.c, points: pts.map((p) => [x(p), p[key].p99]) },
      ], Object.assign({ emptyText: "no " + key.split("_")[0].toUpperCase() + " samples yet" }, span));
    }
  }

  function renderCapacity(cap) {
    const levels = (cap && cap.levels) || [];
    const marks = [];
    if (cap && cap.max_stable_concurrency !== null) marks.push({ x: cap.max_stable_concurrency, label: "max stable " + cap.max_stable_concurrency, color: C.good });
    if (cap && cap.knee !== null) marks.push({ x: cap.knee, label: "knee " + cap.knee, color: C.c, row: 1 });
    lineChart($("chart-capacity"), [{
      name: "throughput (green: stable, red: below target, grey: few samples)", color: C.a, dots: true,
      points: levels.map((l) => [l.concurrency, l.throughput_tokens_per_s, l.stable ? C.good : l.enough_samples ? C.bad : C.muted]),
    }], { marks, xMin: 0, xMax: levels.length ? levels[levels.length - 1].concurrency + 1 : 1, xInt: true, emptyText: "no concurrency levels measured yet" });
  }

  function renderDrift(d) {
    const box = $("drift");
    if (!d) { empty(box, "drift detection is off ([drift] baseline) or has not evaluated yet"); return; }
    const t = el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "dimension"), el("th", {}, "statistic"), el("th", {}, "value"), el("th", {}, "threshold"), el("th", {}, "status"))));
    const tb = el("tbody");
    for (const x of d.dimensions) {
      const status = x.reacceptance_required ? el("span", { class: "bad" }, "re-acceptance required") : x.drifted ? el("span", { class: "warn" }, "drifting") : el("span", { class: "good" }, "ok");
      tb.append(el("tr", { title: x.explanation || "" }, el("td", {}, x.name), el("td", {}, x.statistic), el("td", {}, num(x.value, 3)), el("td", {}, num(x.threshold, 3)), el("td", {}, status)));
    }
    t.append(tb);
    box.replaceChildren(el("div", { class: d.drifted ? "bad" : "good" }, d.drifted ? "traffic has drifted from " + d.baseline : "traffic matches " + d.baseline),
      el("div", { class: "muted" }, `${int(d.live_requests)} live vs ${int(d.baseline_requests)} baseline requests`), t);
  }

  function renderAttribution(s, cal) {
    const box = $("attribution");
    const all = (s && s.attribution) || [];
    const attr = all.filter((a) => a.source !== "requests");
    const perRequest = all.filter((a) => a.source === "requests");
    const kids = [];
    // The engine's own per-request timings: independent of the calibration scrapes.
    if (perRequest.length) {
      const p = (x) => (x && x.p50 !== null ? ms(x.p50) + " / " + ms(x.p95) + " / " + ms(x.p99) : "–");
      const share = (a) => Object.entries(a.miss_share || {}).filter(([, v]) => v > 0).map(([k, v]) => k + " " + pct(v)).join(", ") || "–";
      const t = el("table", {}, el("thead", {}, el("tr", {}, ...["class", "model", "requests", "queue P50/95/99", "prefill", "decode", "outside engine", "misses went to"].map((h) => el("th", {}, h)))));
      const tb = el("tbody");
      for (const a of perRequest) tb.append(el("tr", {}, el("td", {}, a.class), el("td", {}, a.model || "(no model)"), el("td", {}, int(a.requests)), el("td", {}, p(a.queue_ms)), el("td", {}, p(a.prefill_ms.count ? a.prefill_ms : a.inference_ms)), el("td", {}, p(a.decode_ms)), el("td", {}, p(a.outside_engine_ms)), el("td", {}, share(a))));
      t.append(tb); kids.push(el("h3", {}, "Per request, by the engine's own timings"), t);
    }
    if (!cal || !cal.enabled) {
      if (!kids.length) { empty(box, "calibration is off ([calibration] enabled) and no engine reports per-request timings"); return; }
      kids.push(el("div", { class: "muted" }, "calibration is off ([calibration] enabled)"));
      box.replaceChildren(...kids);
      return;
    }
    kids.unshift(el("div", { class: cal.up ? "good" : "bad" }, (cal.up ? "engine metrics up" : "engine metrics down") + " · " + (cal.engine || "unknown engine") + " · last scrape " + (cal.last_result || "–")));
    const g = cal.gpus;
    if (g) {
      // Beside the engine's KV-cache use: a busy GPU with a full cache is compute-bound;
      // a full cache on an idle GPU points elsewhere (memory or interconnect).
      const util = g.utilization_mean === null ? "GPU utilization –" : `GPU utilization ${num(g.utilization_mean, 0)}% mean, ${num(g.utilization_max, 0)}% max`;
      const mem = g.memory_used_share_max === null ? "" : ` · GPU memory ${pct(g.memory_used_share_max)} (fullest)`;
      const up = `${g.gpus} GPUs from ${g.exporters_up}/${g.exporters} exporters` + (g.last_error ? " · " + g.last_error : "");
      kids.push(el("div", { class: g.exporters_up < g.exporters ? "warn" : "" }, util + mem + " · " + up));
    }
    if (attr.length) {
      const t = el("table", {}, el("thead", {}, el("tr", {}, ...["model", "queue", "prefill", "decode", "outside engine", "KV cache", "waiting", "running"].map((h) => el("th", {}, h)))));
      const tb = el("tbody");
      const sec = (v) => (v === null || v === undefined ? "–" : ms(v * 1000));
      for (const a of attr) tb.append(el("tr", {}, el("td", {}, a.model || "(no model)"), el("td", {}, sec(a.queue_seconds)), el("td", {}, sec(a.prefill_seconds)), el("td", {}, sec(a.decode_seconds)), el("td", {}, sec(a.outside_engine_seconds)), el("td", {}, a.kv_cache_usage === null ? "–" : pct(a.kv_cache_usage)), el("td", {}, num(a.requests_waiting, 0)), el("td", {}, num(a.requests_running, 0))));
      t.append(tb); kids.push(el("h3", {}, "Scraped from the engine (window means)"), t);
    }
    const comps = (cal.comparisons || []).filter((c) => c.proxy_seconds !== null && c.engine_seconds !== null);
    if (comps.length) {
      const t = el("table", {}, el("thead", {}, el("tr", {}, ...["model", "metric", "engine", "proxy", "difference"].map((h) => el("th", {}, h)))));
      const tb = el("tbody");
      for (const c of comps) tb.append(el("tr", {}, el("td", {}, c.model), el("td", {}, c.metric), el("td", {}, ms(c.engine_seconds * 1000)), el("td", {}, ms(c.proxy_seconds * 1000)), el("td", {}, ms(c.difference_seconds * 1000))));
      t.append(tb); kids.push(el("h3", {}, "Calibration: engine vs proxy means"), t);
    } else if (!attr.length) kids.push(el("div", { class: "empty" }, "no calibration interval closed yet"));
    box.replaceChildren(...kids);
  }

  function renderShadow(sh) {
    const box = $("shadow");
    if (!sh || !sh.configured) { empty(box, "no candidate configured ([shadow] url)"); return; }
    const drops = Object.entries(sh.dropped || {}).filter(([, n]) => n > 0).map(([k, n]) => k + " " + int(n)).join(", ");
    const head = el("div", { class: sh.enabled ? "good" : "muted" },
      (sh.enabled ? "mirroring " + pct(sh.share) + " of generation requests" : "off (enabled = false)") +
      (sh.switched_on_for_s ? " · switched on by drift for " + int(sh.switched_on_for_s / 60) + " more min" : "") +
      " · dropped: " + (drops || "none"));
    if (!sh.classes.length) { box.replaceChildren(head, el("div", { class: "empty" }, "no pairs in the window yet")); return; }
    const t = el("table", {}, el("thead", {}, el("tr", {}, ...["class", "pairs", "attainment (primary / shadow)", "goodput tok/s", "TTFT p95", "TPOT p95", "output p50", "TTFT ratio (median, 95% CI)", "verdict", "same answers (candidate / secondary)", "answers"].map((h) => el("th", {}, h)))));
    const tb = el("tbody");
    const both = (a, b, f) => f(a) + " / " + f(b);
    const mark = (v) => (v === "pass" ? "good" : v === "fail" ? "bad" : "muted");
    for (const c of sh.classes) {
      const r = c.ttft_ratio.median;
      const ratio = r.value === null ? "–" : num(r.value, 2) + "×" + (r.ci95 ? " [" + num(r.ci95[0], 2) + ", " + num(r.ci95[1], 2) + "]" : "");
      const cls = mark(c.verdict);
      const a = c.answers;
      const same = (v) => (v === null ? "–" : pct(v));
      const words = int(a.pairs) + " · " + same(a.exact_match) + " / " + same(a.noise_exact_match) +
        (a.close_rate === null ? "" : " · close " + pct(a.close_rate));
      tb.append(el("tr", { title: "latency: " + c.reason + "\nanswers: " + a.reason },
        el("td", {}, c.class), el("td", {}, int(c.shadow.requests)),
        el("td", {}, both(c.primary.attainment, c.shadow.attainment, (v) => (v === null ? "–" : pct(v)))),
        el("td", {}, both(c.primary.effective_goodput_tps, c.shadow.effective_goodput_tps, (v) => num(v, 1))),
        el("td", {}, both(c.primary.ttft_ms.p95, c.shadow.ttft_ms.p95, ms)),
        el("td", {}, both(c.primary.tpot_ms.p95, c.shadow.tpot_ms.p95, ms)),
        el("td", {}, both(c.primary.output_tokens.p50, c.shadow.output_tokens.p50, int)),
        el("td", {}, ratio), el("td", { class: cls }, c.verdict),
        el("td", {}, words), el("td", { class: mark(a.verdict) }, a.verdict)));
    }
    t.append(tb);
    box.replaceChildren(head, t, el("div", { class: "muted" }, "verdict: " + sh.rule),
      el("div", { class: "muted" }, "answers: " + sh.answers_rule));
  }

  function renderRecent(r) {
    const body = $("recent");
    const rows = r.requests.slice().reverse();
    if (!rows.length) { body.replaceChildren(el("tr", {}, el("td", { colspan: "13", class: "empty" }, "no requests yet"))); return; }
    body.replaceChildren(...rows.map((q) => el("tr", {},
      el("td", {}, (q.started_at || "").replace("T", " ").replace(/\.\d+Z$/, "Z")),
      el("td", {}, (q.model || "–") + (q.target && q.target !== "primary" ? " · " + q.target : "")), el("td", {}, q.api + (q.stream ? " · stream" : "")), el("td", {}, q.status === null ? "–" : q.status),
      el("td", { class: q.outcome === "ok" ? "" : "bad" }, q.outcome), el("td", {}, q.slo_class || "–"),
      el("td", { class: q.slo_met === true ? "good" : q.slo_met === false ? "bad" : "muted" }, q.slo_met === true ? "met" : q.slo_met === false ? "missed" + (q.slo_miss_reason ? " (" + q.slo_miss_reason + ")" : "") : "–"),
      el("td", {}, ms(q.ttft_ms)), el("td", {}, ms(q.tpot_ms)), el("td", {}, ms(q.e2e_ms)),
      el("td", {}, int(q.input_tokens)), el("td", {}, int(q.output_tokens)), el("td", {}, q.finish_reason || "–"))));
  }

  // ---- loop -------------------------------------------------------------------------
  function setStatus(cls, text) { const s = $("status"); s.className = "status " + cls; s.textContent = text; }
  function showLogin(refused) {
    clearTimeout(state.timer);
    $("dash").classList.add("hidden");
    $("login").classList.remove("hidden");
    $("login-error").classList.toggle("hidden", !refused);
    $("logout").classList.add("hidden");
    setStatus("idle", "token required");
    $("token").focus();
  }
  async function poll() {
    try {
      const [s, cap, t, d, cal, r, sh] = await Promise.all([
        api("/api/v1/summary"), api("/api/v1/capacity", true), api("/api/v1/timeline?limit=180"),
        api("/api/v1/drift?optional=true"), api("/api/v1/calibration", true), api("/api/v1/requests?limit=50"),
        api("/api/v1/shadow", true),
      ]);
      $("login").classList.add("hidden");
      $("dash").classList.remove("hidden");
      $("logout").classList.toggle("hidden", !sessionStorage.getItem(TOKEN_KEY));
      renderSummary(s, cap);
      renderTimeline(t);
      renderCapacity(cap);
      renderDrift(d);
      renderAttribution(s, cal);
      renderShadow(sh);
      renderRecent(r);
      state.summary = s;
      state.polls += 1;
      $("error-banner").classList.add("hidden");
      setStatus("ok", "updated " + new Date().toLocaleTimeString());
    } catch (e) {
      if (e instanceof Unauthorized) {
        const had = sessionStorage.getItem(TOKEN_KEY) !== null;
        sessionStorage.removeItem(TOKEN_KEY);
        showLogin(had);
        return;
      }
      $("error-banner").textContent = "Cannot reach the admin API: " + e.message;
      $("error-banner").classList.remove("hidden");
      setStatus("err", "disconnected");
    }
    state.timer = setTimeout(poll, POLL_MS);
  }
  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const token = $("token").value.trim();
      if (!token) return;
      sessionStorage.setItem(TOKEN_KEY, token);
      $("token").value = "";
      poll();
    });
    $("logout").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); showLogin(false); });
    poll();
  });
})();
