/* cwlens contribution graph viewer: a small canvas renderer, no library, no network.
 * cwlensGraphViewer(root, data) draws the graph of cwlens.graphs.viewer.payload(data)
 * into the <div> root and returns its handle (also window.cwlensGraph, the last one made):
 *   select(layer, position) -> rows [{from_layer, from_position, weight, heads, residual, rank}]
 *   visibleEdges()          -> edges drawn at the current threshold / top-k / routes
 *   setThreshold(t), setTopK(k), setMetric(name | "both"), setRoutes(on), search(text), fit()
 * Licence: MIT, part of cwlens. */
(function () {
  "use strict";
  if (window.cwlensGraphViewer) return;

  function decode(s, Type) {
    var bin = atob(s), n = bin.length, buf = new Uint8Array(n);
    for (var i = 0; i < n; i++) buf[i] = bin.charCodeAt(i);
    return new Type(buf.buffer);
  }
  function el(tag, attrs, parent) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) {
      if (k === "text") e.textContent = attrs[k]; else if (k === "html") e.innerHTML = attrs[k];
      else e.setAttribute(k, attrs[k]);
    }
    if (parent) parent.appendChild(e);
    return e;
  }
  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) { return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]; });
  }
  function fmt(v) { return (v >= 0 ? "+" : "") + v.toFixed(4); }
  function tok(s) { return JSON.stringify(s).slice(1, -1); }

  function Metric(m, B, n, H) {
    this.name = m.name; this.topK = m.top_k; this.K = m.slots;
    this.from = decode(m.from, m.from_bytes === 2 ? Int16Array : Int32Array);
    this.weight = decode(m.weight, Float32Array);
    this.residual = decode(m.residual, Float32Array);
    this.attention = decode(m.attention, Float32Array);
    this.headShare = m.head_share ? decode(m.head_share, Float32Array) : null;
    this.mh = m.heads_per_edge || 0;
    this.headIndex = m.head_index ? decode(m.head_index, Uint8Array) : null;  // none: every head, in order
    this.headValue = this.mh ? decode(m.head_value, Float32Array) : null;
    this.fm = m.factor_m || 0;
    this.factorHeads = this.fm ? decode(m.factor_heads, Uint8Array) : null;
    this.factors = this.fm ? decode(m.factors, Float32Array) : null;
    this.B = B; this.n = n; this.H = H;
    this.routeKeep = null;
    var top = 0;  // the strongest edge between two positions: the widest line
    for (var idx = 0; idx < this.weight.length; idx++) {
      if (idx % this.K !== 0 && this.from[idx] >= 0) top = Math.max(top, Math.abs(this.weight[idx]));
    }
    this.maxCross = top > 0 ? top : 1;
  }

  // Ferrando & Voita (2024) routes: from (top, target) down, keep incoming edges with
  // weight >= threshold (and rank <= topK) of the nodes reached (cwlens.graphs.routes)
  Metric.prototype.routes = function (target, threshold, topK) {
    var B = this.B, n = this.n, K = this.K, keep = new Uint8Array(B * n * K);
    var reached = new Uint8Array(n); reached[target] = 1;
    for (var b = B - 1; b >= 0; b--) {
      var below = new Uint8Array(n);
      for (var i = 0; i < n; i++) {
        if (!reached[i]) continue;
        var base = (b * n + i) * K;
        for (var s = 0; s < K && s <= topK; s++) {
          var j = this.from[base + s], w = this.weight[base + s];
          if (j >= 0 && w >= threshold) { keep[base + s] = 1; below[j] = 1; }
        }
      }
      reached = below;
    }
    return keep;
  };

  var LOG_MIN = -4;  // the threshold slider: 10^-4 .. 1, and 0 at its left end
  function fromSlider(v) { v = parseFloat(v); return v <= LOG_MIN ? 0 : Math.pow(10, v); }
  function toSlider(t) { return t <= 0 ? LOG_MIN : Math.max(LOG_MIN + 0.01, Math.min(0, Math.log10(t))); }

  window.cwlensGraphViewer = function (root, data) {
    var tokens = data.tokens, n = tokens.length, layers = data.layers, B = layers.length, H = data.n_heads;
    var metrics = data.metrics.map(function (m) { return new Metric(m, B, n, H); });
    var maxK = metrics[0].topK;
    // display levels 0..B: level 0 is node layer layers[0] - 1, level k is layers[k - 1]
    var nodeLayer = function (level) { return level === 0 ? layers[0] - 1 : layers[level - 1]; };
    var state = {metric: 0, both: false, threshold: 0.02, topK: maxK, routes: false,
                 selected: null, matches: [], matchAt: -1, sx: 1, ox: 0};
    if (data.route) { state.routes = true; state.selected = {level: B, pos: data.route.target};
                      state.threshold = data.route.threshold; }

    // -- the page's parts ---------------------------------------------------------------
    root.innerHTML = "";
    var bar = el("div", {"class": "cwg-bar"}, root);
    el("span", {"class": "cwg-title", text: data.title}, bar);
    var metricSel = el("select", {"title": "metric"}, el("label", {text: "metric "}, bar));
    metrics.forEach(function (m, k) { el("option", {value: String(k), text: m.name}, metricSel); });
    if (metrics.length > 1) el("option", {value: "both", text: "both, side by side"}, metricSel);
    var thrLabel = el("label", {text: "|weight| \u2265 "}, bar);
    // a log scale (most edges between positions weigh 0.001-0.05): the slider's value is
    // log10(threshold), its lowest position 0; the box beside it takes an exact number
    var thr = el("input", {type: "range", min: String(LOG_MIN), max: "0", step: "any", "class": "cwg-threshold",
                           title: "|weight| threshold (log scale; leftmost: 0)"}, thrLabel);
    var thrVal = el("input", {type: "number", min: "0", max: "1", step: "0.001", "class": "cwg-threshold-value"}, thrLabel);
    var kLabel = el("label", {text: "top-k "}, bar);
    var kIn = el("input", {type: "range", min: "0", max: String(maxK), step: "1", value: String(maxK), "class": "cwg-topk"}, kLabel);
    var kVal = el("span", {"class": "cwg-val"}, kLabel);
    var routeLabel = el("label", {title: "only the routes (Ferrando & Voita 2024) to the selected position"}, bar);
    var routeIn = el("input", {type: "checkbox", "class": "cwg-routes"}, routeLabel);
    routeLabel.appendChild(document.createTextNode("routes to selected"));
    var searchIn = el("input", {type: "search", placeholder: "search a token \u23CE", "class": "cwg-search"}, bar);
    var fitBtn = el("button", {text: "fit"}, bar);
    var count = el("span", {"class": "cwg-count"}, bar);
    el("span", {"class": "cwg-legend", html: "<b class=p>\u2014</b> positive <b class=n>\u2014</b> negative; width \u221D |weight|; wheel: zoom, drag: pan, click a node"}, bar);
    var main = el("div", {"class": "cwg-main"}, root);
    var plotsDiv = el("div", {"class": "cwg-plots"}, main);
    var panel = el("div", {"class": "cwg-panel", html: "<p class=muted>Click a node (a position at a layer) to list its incoming edges.</p>"}, main);
    var tip = el("div", {"class": "cwg-tip"}, root);
    var plots = [];
    function makePlot() {
      var div = el("div", {"class": "cwg-plot"}, plotsDiv);
      var canvas = el("canvas", {}, div);
      var name = el("div", {"class": "cwg-name"}, div);
      var p = {div: div, canvas: canvas, name: name, metric: 0};
      hookEvents(p);
      plots.push(p);
      return p;
    }

    // -- geometry -----------------------------------------------------------------------
    var M = {left: 46, right: 20, top: 30, bottom: 86};
    function dims(p) {
      var w = p.div.clientWidth, h = p.div.clientHeight;
      return {w: w, h: h, pw: Math.max(10, w - M.left - M.right), ph: Math.max(10, h - M.top - M.bottom)};
    }
    function X(pos) { return M.left + state.ox + pos * state.sx; }
    function Y(d, level) { return M.top + d.ph - level * d.ph / B; }
    function fit() {
      var d = dims(plots[0]);
      state.sx = n > 1 ? d.pw / (n - 1) : d.pw;
      state.ox = n > 1 ? 0 : d.pw / 2;
      draw();
    }

    // -- what is visible ------------------------------------------------------------------
    function current() { return metrics[state.metric]; }
    function visibleMask(m) {
      if (state.routes && state.selected) {
        if (!m.routeKeep || m.routeKey !== [state.selected.pos, state.threshold, state.topK].join()) {
          m.routeKeep = m.routes(state.selected.pos, state.threshold, state.topK);
          m.routeKey = [state.selected.pos, state.threshold, state.topK].join();
        }
        return m.routeKeep;
      }
      return null;
    }
    function isVisible(m, idx, slot, keep) {
      if (keep) return keep[idx] === 1;
      if (slot > state.topK) return false;
      var j = m.from[idx];
      if (j < 0) return false;
      var w = m.weight[idx];
      return Math.abs(w) >= state.threshold;
    }
    function visibleEdges(m) {
      m = m || current();
      var keep = visibleMask(m), c = 0, K = m.K, total = B * n * K;
      for (var idx = 0; idx < total; idx++) if (isVisible(m, idx, idx % K, keep)) c++;
      return c;
    }

    // -- drawing --------------------------------------------------------------------------
    var LEVELS = 8, MAX_LINES = 20000, HBINS = 96;
    // |w| in bins of a quarter octave, strongest first (bin 0: |w| >= 1)
    function binOf(w) { var a = Math.abs(w); return a >= 1 ? 0 : Math.min(HBINS - 1, 1 + Math.floor(-Math.log2(a) * 4)); }
    function bucketOf(w, top) { return Math.min(LEVELS - 1, Math.floor(Math.sqrt(Math.min(1, Math.abs(w) / top)) * LEVELS)); }
    function drawPlot(p) {
      var d = dims(p), dpr = window.devicePixelRatio || 1, c = p.canvas;
      if (c.width !== Math.round(d.w * dpr) || c.height !== Math.round(d.h * dpr)) {
        c.width = Math.round(d.w * dpr); c.height = Math.round(d.h * dpr);
      }
      var ctx = c.getContext("2d");
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, d.w, d.h);
      var m = metrics[p.metric];
      p.name.textContent = m.name;
      var lo = Math.max(0, Math.floor((-state.ox) / state.sx) - 1), hi = Math.min(n - 1, Math.ceil((d.pw - state.ox) / state.sx) + 1);
      // layer grid and labels
      ctx.font = "11px system-ui, sans-serif"; ctx.fillStyle = "#6b7280"; ctx.strokeStyle = "#f1f3f5"; ctx.lineWidth = 1;
      var every = Math.max(1, Math.ceil(14 / (d.ph / B)));
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      for (var lv = 0; lv <= B; lv++) {
        var y = Y(d, lv);
        ctx.beginPath(); ctx.moveTo(M.left, y); ctx.lineTo(d.w - M.right, y); ctx.stroke();
        if (lv % every === 0 || lv === B) ctx.fillText((lv === 0 && nodeLayer(0) === 0) ? "emb" : "L" + nodeLayer(lv), M.left - 6, y);
      }
      ctx.save();
      ctx.beginPath(); ctx.rect(M.left - 4, 0, d.pw + 8, d.h); ctx.clip();
      // edges between positions, in buckets of (sign, width): one path each. At most
      // MAX_LINES are drawn (the strongest in view: a log-histogram of |weight| finds the
      // cutoff), since a canvas rasterises every segment; zoom in to see the weaker ones.
      var keep = visibleMask(m), K = m.K, from = m.from, weight = m.weight, paths = [];
      for (var q = 0; q < 2 * LEVELS; q++) paths.push([]);
      var hist = new Int32Array(HBINS), inView = 0, b, i, s, idx, j, w, base;
      for (b = 0; b < B; b++) {
        for (i = 0; i < n; i++) {
          base = (b * n + i) * K;
          for (s = 1; s < K; s++) {
            idx = base + s;
            if (!isVisible(m, idx, s, keep)) continue;
            j = from[idx];
            if ((i < lo && j < lo) || (i > hi && j > hi)) continue;
            hist[binOf(weight[idx])]++; inView++;
          }
        }
      }
      var cutBin = HBINS, total = 0;  // draw the bins below cutBin (strongest first)
      for (var hb = 0; hb < HBINS; hb++) { if (total + hist[hb] > MAX_LINES) break; total += hist[hb]; cutBin = hb + 1; }
      if (cutBin > HBINS) cutBin = HBINS;
      var drawn = 0;
      for (b = 0; b < B; b++) {
        var y1 = Y(d, b + 1), y0 = Y(d, b);
        for (i = 0; i < n; i++) {
          var xi = X(i);
          base = (b * n + i) * K;
          for (s = 1; s < K; s++) {
            idx = base + s;
            if (!isVisible(m, idx, s, keep)) continue;
            j = from[idx];
            if ((i < lo && j < lo) || (i > hi && j > hi)) continue;
            w = weight[idx];
            if (binOf(w) >= cutBin) continue;
            paths[(w < 0 ? LEVELS : 0) + bucketOf(w, m.maxCross)].push(X(j), y0, xi, y1);
            drawn++;
          }
        }
      }
      // the residual stream: each self edge where few are in view, else one line a position
      var nView = hi - lo + 1;
      ctx.strokeStyle = "rgba(107,114,128,0.45)";
      if (nView * B <= 8000) {
        for (b = 0; b < B; b++) {
          for (i = lo; i <= hi; i++) {
            idx = (b * n + i) * K;
            if (!isVisible(m, idx, 0, keep)) continue;
            ctx.lineWidth = 0.6 + 1.6 * Math.min(1, Math.abs(weight[idx]));
            ctx.beginPath(); ctx.moveTo(X(i), Y(d, b)); ctx.lineTo(X(i), Y(d, b + 1)); ctx.stroke();
          }
        }
      } else if (state.sx >= 1.5 && !keep) {
        ctx.lineWidth = 1; ctx.beginPath();
        for (i = lo; i <= hi; i++) { ctx.moveTo(X(i), Y(d, 0)); ctx.lineTo(X(i), Y(d, B)); }
        ctx.stroke();
      }
      for (q = 0; q < 2 * LEVELS; q++) {
        var pts = paths[q];
        if (!pts.length) continue;
        var lvq = q % LEVELS, neg = q >= LEVELS;
        ctx.lineWidth = 0.5 + lvq * 0.6;
        ctx.strokeStyle = neg ? "rgba(220,38,38," + (0.3 + 0.09 * lvq) + ")" : "rgba(37,99,235," + (0.3 + 0.09 * lvq) + ")";
        ctx.beginPath();
        for (var t = 0; t < pts.length; t += 4) { ctx.moveTo(pts[t], pts[t + 1]); ctx.lineTo(pts[t + 2], pts[t + 3]); }
        ctx.stroke();
      }
      p.drawn = drawn; p.inView = inView;
      // the selected node's incoming edges (those drawn at these settings), on top
      var sel = state.selected;
      if (sel && sel.level > 0) {
        var sb = sel.level - 1, sbase = (sb * n + sel.pos) * K;
        ctx.strokeStyle = "rgba(245,158,11,0.95)";
        for (s = 0; s < K; s++) {
          if (!isVisible(m, sbase + s, s, keep)) continue;
          ctx.lineWidth = 1.5 + 4 * Math.min(1, Math.sqrt(Math.abs(weight[sbase + s]) / (s === 0 ? 1 : m.maxCross)));
          ctx.beginPath(); ctx.moveTo(X(from[sbase + s]), Y(d, sb)); ctx.lineTo(X(sel.pos), Y(d, sel.level)); ctx.stroke();
        }
      }
      // nodes
      var r = Math.min(4, state.sx / 3);
      if (r >= 1.2) {
        ctx.fillStyle = "#9ca3af";
        for (lv = 0; lv <= B; lv++) {
          y = Y(d, lv); ctx.beginPath();
          for (i = lo; i <= hi; i++) { ctx.moveTo(X(i) + r, y); ctx.arc(X(i), y, r, 0, 6.2832); }
          ctx.fill();
        }
      }
      // search matches and the selected node
      ctx.strokeStyle = "#f59e0b"; ctx.lineWidth = 2;
      state.matches.forEach(function (pos) {
        if (pos < lo || pos > hi) return;
        ctx.beginPath(); ctx.moveTo(X(pos), Y(d, 0)); ctx.lineTo(X(pos), Y(d, B)); ctx.globalAlpha = 0.35; ctx.stroke(); ctx.globalAlpha = 1;
      });
      if (state.selected) {
        ctx.strokeStyle = "#111827"; ctx.lineWidth = 2;
        ctx.beginPath(); ctx.arc(X(state.selected.pos), Y(d, state.selected.level), Math.max(5, r + 3), 0, 6.2832); ctx.stroke();
      }
      ctx.restore();
      // token labels: position-numbered, shown where they fit (zoom in for more)
      ctx.save();
      ctx.beginPath(); ctx.rect(0, Y(d, 0) + 2, d.w, d.h); ctx.clip();
      ctx.fillStyle = "#111827"; ctx.font = "11px ui-monospace, SFMono-Regular, Menlo, monospace";
      var step = Math.max(1, Math.ceil(14 / state.sx)), yb = Y(d, 0) + 8;
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      for (i = Math.ceil(lo / step) * step; i <= hi; i += step) {
        var label = step === 1 ? i + " " + tok(tokens[i]).slice(0, 14) : String(i);
        ctx.save(); ctx.translate(X(i), yb); ctx.rotate(-Math.PI / 3);
        if (state.matches.indexOf(i) >= 0) ctx.fillStyle = "#b45309";
        ctx.fillText(label, 0, 0); ctx.restore();
      }
      ctx.restore();
      return drawn;
    }
    var pending = false;
    function draw() {
      pending = false;
      state.draws = (state.draws || 0) + 1;
      plots.forEach(drawPlot);
      if (document.activeElement !== thrVal) thrVal.value = String(+state.threshold.toPrecision(3));
      kVal.textContent = String(state.topK);
      var shown = visibleEdges(), p0 = plots[0];
      count.textContent = shown.toLocaleString() + " edges" + (p0.inView > p0.drawn
        ? " (in view, the strongest " + p0.drawn.toLocaleString() + " of " + p0.inView.toLocaleString() + " drawn: zoom in for more)" : "") +
        (data.metrics[0].graph_top_k ? "; the page keeps each node's top " + maxK + " of " + data.metrics[0].graph_top_k + " (the page's size)" : "");
    }
    function redraw() { if (!pending) { pending = true; requestAnimationFrame(draw); } }

    // -- the side panel ---------------------------------------------------------------------
    function rowsOf(m, level, pos) {
      var rows = [];
      if (level < 1) return rows;
      var b = level - 1, base = (b * n + pos) * m.K;
      for (var s = 0; s < m.K; s++) {
        var idx = base + s, j = m.from[idx];
        if (j < 0) continue;
        var heads = null;
        if (m.mh) {
          heads = []; for (var h = 0; h < H; h++) heads.push(null);
          for (var t = 0; t < m.mh; t++) heads[m.headIndex ? m.headIndex[idx * m.mh + t] : t] = m.headValue[idx * m.mh + t];
        }
        var row = {from_layer: nodeLayer(level) - 1, from_position: j, weight: m.weight[idx], heads: heads,
                   residual: s === 0 ? m.residual[b * n + pos] : 0, rank: s, from_token: tokens[j]};
        if (m.fm) {
          row.factors = [];
          for (t = 0; t < m.fm; t++) {
            var f = (idx * m.fm + t) * 3, hd = m.factorHeads[idx * m.fm + t];
            row.factors.push({head: hd, attention: m.factors[f], relative_norm: m.factors[f + 1], cosine: m.factors[f + 2]});
          }
        }
        rows.push(row);
      }
      return rows;
    }
    function table(m, level, pos) {
      var rows = rowsOf(m, level, pos), b = level - 1;
      var out = "<h4>" + esc(m.name) + "</h4>";
      out += "<div class=muted>residual share " + fmt(m.residual[b * n + pos]) + " \u00b7 attention share " + fmt(m.attention[b * n + pos]) + "</div>";
      if (m.headShare) {
        out += "<div class=muted>each head's share of the layer here: ";
        for (var h = 0; h < H; h++) {
          var v = m.headShare[(b * n + pos) * H + h];
          out += "<span title='head " + h + "'>H" + h + " <span class=bar style='width:" + Math.round(Math.min(1, Math.abs(v)) * 40) + "px'></span> " + v.toFixed(2) + "</span> ";
        }
        out += "</div>";
      }
      if (m.fm) out += "<div class='muted f'>a head's part = attention share \u00d7 c<sub>h</sub>, c<sub>h</sub> = \u03b1 \u00b7 \u2016\u1e7d\u2016/\u2016o\u2016 \u00b7 cos</div>";
      if (!m.mh && !m.fm) out += "<div class='muted f'>heads not embedded at this size (the page stays under 25 MB): graph.node(layer, position) in Python has them</div>";
      out += "<table><tr><th>from</th><th>weight</th><th>largest heads</th></tr>";
      rows.forEach(function (r) {
        var cls = r.weight < 0 ? "neg" : "pos", heads = "";
        if (r.factors) {
          heads = r.factors.map(function (f) {
            var part = r.heads ? r.heads[f.head] : null;
            return "H" + f.head + (part === null ? "" : " " + fmt(part)) + " <span class='muted f'>(\u03b1 " + f.attention.toFixed(3) +
              " \u00b7 \u2016\u1e7d\u2016/\u2016o\u2016 " + f.relative_norm.toFixed(2) + " \u00b7 cos " + f.cosine.toFixed(2) + ")</span>";
          }).join("<br>");
        } else if (r.heads) {
          var order = r.heads.map(function (v, h) { return [v, h]; }).filter(function (x) { return x[0] !== null; })
            .sort(function (a, c) { return Math.abs(c[0]) - Math.abs(a[0]); }).slice(0, 3);
          heads = order.map(function (x) { return "H" + x[1] + " " + fmt(x[0]); }).join("<br>");
        } else heads = "<span class=muted>\u2014</span>";
        out += "<tr><td>" + (r.from_layer === 0 && nodeLayer(0) === 0 ? "emb" : "L" + r.from_layer) + ":" + r.from_position + " <code>" + esc(tok(r.from_token)) + "</code>" +
          (r.rank === 0 ? " <span class=muted>(self: residual " + fmt(r.residual) + ")</span>" : "") +
          "</td><td class=" + cls + ">" + fmt(r.weight) + "</td><td>" + heads + "</td></tr>";
      });
      return out + "</table>";
    }
    function showPanel() {
      var sel = state.selected;
      if (!sel) return;
      var head = "<h4>layer " + nodeLayer(sel.level) + ", position " + sel.pos + " <code>" + esc(tok(tokens[sel.pos])) + "</code></h4>";
      if (sel.level === 0) { panel.innerHTML = head + "<p class=muted>The bottom layer has no incoming edges" + (nodeLayer(0) === 0 ? " (token embeddings)" : "") + ".</p>"; return; }
      var shown = state.both ? [0, 1] : [state.metric];
      panel.innerHTML = head + shown.map(function (k) { return table(metrics[k], sel.level, sel.pos); }).join("");
    }
    function levelOfLayer(layer) {
      if (layer === nodeLayer(0)) return 0;
      var k = layers.indexOf(layer);
      return k < 0 ? -1 : k + 1;
    }
    function select(layer, position) {
      var level = levelOfLayer(layer);
      if (level < 0) throw new Error("layer " + layer + " is not in this graph (layers " + nodeLayer(0) + ".." + layers[B - 1] + ")");
      if (position < 0) position += n;
      if (!(position >= 0 && position < n)) throw new Error("position " + position + " is out of range (0.." + (n - 1) + ")");
      state.selected = {level: level, pos: position};
      showPanel(); redraw();
      return rowsOf(current(), level, position).map(function (r) {
        return {from_layer: r.from_layer, from_position: r.from_position, weight: r.weight, heads: r.heads,
                residual: r.residual, rank: r.rank};
      });
    }

    // -- mouse --------------------------------------------------------------------------------
    function nodeAt(p, x, y) {
      var d = dims(p), level = Math.round((M.top + d.ph - y) / (d.ph / B)), pos = Math.round((x - M.left - state.ox) / state.sx);
      if (level < 0 || level > B || pos < 0 || pos >= n) return null;
      var dx = X(pos) - x, dy = Y(d, level) - y;
      return dx * dx + dy * dy <= Math.pow(Math.max(6, Math.min(12, state.sx / 2)), 2) ? {level: level, pos: pos} : null;
    }
    function edgeAt(p, x, y) {
      var d = dims(p), m = metrics[p.metric], f = (M.top + d.ph - y) / (d.ph / B), b = Math.floor(f);
      if (b < 0 || b >= B) return null;
      var y0 = Y(d, b), y1 = Y(d, b + 1), keep = visibleMask(m), best = null, bestD = 16, K = m.K;
      for (var i = 0; i < n; i++) {
        var base = (b * n + i) * K, xi = X(i);
        for (var s = 0; s < K; s++) {
          var idx = base + s;
          if (!isVisible(m, idx, s, keep)) continue;
          var xj = X(m.from[idx]), t = (y - y0) / (y1 - y0), ex = xj + (xi - xj) * t, dd = (ex - x) * (ex - x);
          if (dd < bestD) { bestD = dd; best = {b: b, i: i, j: m.from[idx], w: m.weight[idx]}; }
        }
      }
      return best;
    }
    function hookEvents(p) {
      var c = p.canvas, drag = null;
      c.addEventListener("wheel", function (e) {
        e.preventDefault();
        var rect = c.getBoundingClientRect(), x = e.clientX - rect.left - M.left;
        var z = Math.exp(-e.deltaY * 0.0015), d = dims(p);
        var sx = Math.min(240, Math.max(d.pw / Math.max(n, 1) * 0.5, state.sx * z));
        state.ox = x - (x - state.ox) * sx / state.sx; state.sx = sx; state.touched = true;
        redraw();
      }, {passive: false});
      c.addEventListener("pointerdown", function (e) { drag = {x: e.clientX, ox: state.ox, moved: false}; c.setPointerCapture(e.pointerId); });
      c.addEventListener("pointermove", function (e) {
        var rect = c.getBoundingClientRect(), x = e.clientX - rect.left, y = e.clientY - rect.top;
        if (drag) {
          if (Math.abs(e.clientX - drag.x) > 3) drag.moved = true;
          if (drag.moved) { state.ox = drag.ox + e.clientX - drag.x; state.touched = true; tip.style.display = "none"; redraw(); return; }
        }
        var node = nodeAt(p, x, y), text = null, m = metrics[p.metric];
        if (node) {
          text = "layer " + nodeLayer(node.level) + ", position " + node.pos + " \u00ab" + tok(tokens[node.pos]) + "\u00bb";
          if (node.level > 0) text += " \u00b7 residual share " + fmt(m.residual[(node.level - 1) * n + node.pos]);
        } else {
          var e2 = edgeAt(p, x, y);
          if (e2) text = "L" + nodeLayer(e2.b) + ":" + e2.j + " \u00ab" + tok(tokens[e2.j]) + "\u00bb \u2192 L" + nodeLayer(e2.b + 1) + ":" + e2.i + " \u00ab" + tok(tokens[e2.i]) + "\u00bb  " + m.name + " " + fmt(e2.w);
        }
        if (text) {
          var rr = root.getBoundingClientRect();
          tip.textContent = text; tip.style.display = "block";
          tip.style.left = Math.min(e.clientX - rr.left + 12, rr.width - 20) + "px"; tip.style.top = (e.clientY - rr.top + 14) + "px";
        } else tip.style.display = "none";
      });
      c.addEventListener("pointerleave", function () { tip.style.display = "none"; });
      c.addEventListener("pointerup", function (e) {
        var was = drag; drag = null;
        if (was && !was.moved) {
          var rect = c.getBoundingClientRect(), node = nodeAt(p, e.clientX - rect.left, e.clientY - rect.top);
          if (node) select(nodeLayer(node.level), node.pos);
        }
      });
    }

    // -- controls -------------------------------------------------------------------------------
    function setMetric(v) {
      v = String(v);
      var k = metrics.map(function (m) { return m.name; }).indexOf(v);
      state.both = v === "both" && metrics.length > 1;
      state.metric = state.both ? 0 : (k >= 0 ? k : Math.min(metrics.length - 1, parseInt(v, 10) || 0));
      metricSel.value = state.both ? "both" : String(state.metric);
      var want = state.both ? 2 : 1;
      while (plots.length < want) makePlot();
      while (plots.length > want) { var p = plots.pop(); plotsDiv.removeChild(p.div); }
      plots[0].metric = state.metric; if (state.both) plots[1].metric = 1;
      showPanel(); fit();
    }
    metricSel.addEventListener("change", function () { setMetric(metricSel.value); });
    thr.addEventListener("input", function () { state.threshold = fromSlider(thr.value); showPanel(); redraw(); });
    thrVal.addEventListener("change", function () {
      var t = parseFloat(thrVal.value);
      if (t >= 0) { state.threshold = t; thr.value = String(toSlider(t)); showPanel(); redraw(); }
    });
    kIn.addEventListener("input", function () { state.topK = parseInt(kIn.value, 10); redraw(); });
    routeIn.addEventListener("change", function () {
      state.routes = routeIn.checked;
      if (state.routes && !state.selected) state.selected = {level: B, pos: n - 1};
      redraw();
    });
    function search(text) {
      var qy = String(text || "").trim().toLowerCase();
      state.matches = [];
      if (qy) for (var i = 0; i < n; i++) if (tokens[i].toLowerCase().indexOf(qy) >= 0 || String(i) === qy) state.matches.push(i);
      if (state.matches.length) {
        state.matchAt = (state.matchAt + 1) % state.matches.length;
        var d = dims(plots[0]), pos = state.matches[state.matchAt];
        if (state.sx < 16) state.sx = 18;
        state.touched = true;
        state.ox = d.pw / 2 - pos * state.sx;
      }
      redraw();
      return state.matches.slice();
    }
    searchIn.addEventListener("keydown", function (e) { if (e.key === "Enter") search(searchIn.value); });
    searchIn.addEventListener("input", function () { state.matchAt = -1; if (!searchIn.value) search(""); });
    fitBtn.addEventListener("click", function () { state.touched = false; fit(); });
    // a notebook may lay the cell out after the script ran: refit until the user moves the view
    if (typeof ResizeObserver !== "undefined") new ResizeObserver(function () { if (state.touched) redraw(); else fit(); }).observe(root);

    makePlot();
    routeIn.checked = state.routes;
    thr.value = String(toSlider(state.threshold));
    setMetric("0");
    if (state.selected) showPanel();
    var api = {
      select: select,
      visibleEdges: function () { return visibleEdges(); },
      setThreshold: function (t) { state.threshold = +t; thr.value = String(toSlider(+t)); showPanel(); draw(); return visibleEdges(); },
      setTopK: function (k) { state.topK = +k; kIn.value = String(k); draw(); return visibleEdges(); },
      setMetric: function (v) { setMetric(v); draw(); return state.both ? "both" : current().name; },
      setRoutes: function (on) { routeIn.checked = !!on; state.routes = !!on; if (on && !state.selected) state.selected = {level: B, pos: n - 1}; draw(); return visibleEdges(); },
      search: search,
      fit: fit,
      metric: function () { return state.both ? "both" : current().name; },
      // where node (layer, position) is drawn, in the page's client coordinates (for tests)
      point: function (layer, position, plot) {
        var p = plots[plot || 0], d = dims(p), r = p.canvas.getBoundingClientRect();
        return {x: r.left + X(position), y: r.top + Y(d, levelOfLayer(layer))};
      },
      panel: panel,
      state: state, root: root
    };
    api.readyMs = performance.now();  // the first drawing is done
    root.cwlensGraph = api;
    window.cwlensGraph = api;
    (window.cwlensGraphs = window.cwlensGraphs || []).push(api);
    return api;
  };
})();
