// llmc-trace graph viewer: pictures laid out by Graphviz that unfold in place; pan, zoom,
// search (into folded parts too) and a details panel. Reads the JSON the Python side wrote
// into <script id="llmc-data">; loads nothing.
//
// Unfolding swaps a box for a card holding the picture it unfolds into, and opens a gap below
// and to the right of the box: points below the box move down by the extra height, points to
// its right (from its top down) move right by the extra width. Everything above and to the
// left stays where it was, edges stretch with their ends, and nothing is laid out again.
(function () {
  "use strict";

  const SVG_NS = "http://www.w3.org/2000/svg";
  const HEAD = 22; // card title bar height
  const PAD = 8; // card padding
  const data = JSON.parse(document.getElementById("llmc-data").textContent);
  const canvas = document.getElementById("canvas");
  const panel = document.getElementById("panel");
  const search = document.getElementById("search");
  const count = document.getElementById("search-count");

  function make(tag, attributes, parent) {
    const element = document.createElementNS(SVG_NS, tag);
    Object.keys(attributes || {}).forEach(function (k) { element.setAttribute(k, attributes[k]); });
    if (parent) parent.appendChild(element);
    return element;
  }

  // ------------------------------------------------------------------ template instances
  // Module pictures are shared by identical modules and name their boxes relatively; each
  // box placed on the page gets the id "m-<module path>" and the facts recorded here.
  const instances = new Map();

  function joinPath(prefix, name) { return prefix ? prefix + "." + name : name; }

  function registerTemplate(key, prefix, parent, subgraph) {
    data.templates[key].forEach(function (record) {
      const path = joinPath(prefix, record.name);
      const id = "m-" + path;
      const unfold = record.unfold ? {
        fragment: record.unfold,
        title: path,
        path: record.prefix === "self" ? path : prefix,
      } : null;
      instances.set(id, {
        title: path,
        fields: [["path", path]].concat(record.fields),
        subgraph: subgraph,
        parent: parent,
        unfold: unfold,
        path: path,
      });
      if (unfold) registerTemplate(unfold.fragment, unfold.path, id, subgraph);
    });
  }
  Object.keys(data.unfolds).forEach(function (id) {
    const unfold = data.unfolds[id];
    if (unfold.path !== null && data.templates[unfold.fragment]) {
      const info = data.nodes[id];
      registerTemplate(unfold.fragment, unfold.path, id, info ? info.subgraph : null);
    }
  });

  function infoOf(id) { return data.nodes[id] || instances.get(id) || null; }
  function unfoldOf(id) {
    if (data.unfolds[id]) return data.unfolds[id];
    const instance = instances.get(id);
    return instance ? instance.unfold : null;
  }
  function parentOf(id) {
    if (data.parents[id]) return data.parents[id];
    const instance = instances.get(id);
    return instance ? instance.parent : null;
  }

  // ------------------------------------------------------------------ geometry
  // Graphviz writes absolute coordinates: paths as "M x,y C x,y x,y x,y ...", polygons as
  // "x,y x,y ...". A gap is {x0, top, y0, dx, dy}: the unfolded box's right edge, top and
  // bottom in the picture's own coordinates, and how much room its card needs beyond it.
  function shiftX(gaps, x, y) {
    let shift = 0;
    gaps.forEach(function (g) { if (x > g.x0 && y > g.top) shift += g.dx; });
    return shift;
  }
  function shiftY(gaps, y) {
    let shift = 0;
    gaps.forEach(function (g) { if (y > g.y0) shift += g.dy; });
    return shift;
  }
  function numbers(text) { return (text.match(/-?[\d.]+(?:e-?\d+)?/g) || []).map(Number); }
  function pairs(values) {
    const points = [];
    for (let i = 0; i + 1 < values.length; i += 2) points.push([values[i], values[i + 1]]);
    return points;
  }
  function bounds(points) {
    const xs = points.map(function (p) { return p[0]; });
    const ys = points.map(function (p) { return p[1]; });
    return { x0: Math.min.apply(null, xs), y0: Math.min.apply(null, ys),
             x1: Math.max.apply(null, xs), y1: Math.max.apply(null, ys) };
  }

  // Something in a picture that moves when a gap opens, and how.
  function movable(element) {
    const tag = element.tagName;
    const kind = element.getAttribute("class");
    if (kind === "node") {
      const box = element.getBBox();
      return { element: element, box: { x: box.x, y: box.y, w: box.width, h: box.height },
        apply: function (gaps) {
          const dx = shiftX(gaps, box.x, box.y + box.height / 2);
          const dy = shiftY(gaps, box.y);
          element.setAttribute("transform", "translate(" + dx + " " + dy + ")");
        } };
    }
    if (kind === "edge" || kind === "cluster" || tag === "g") {
      const parts = Array.prototype.map.call(element.children, function (child) {
        return kind === "cluster" ? stretched(child) : movable(child);
      }).filter(Boolean);
      return { element: element, apply: function (gaps) {
        parts.forEach(function (part) { part.apply(gaps); });
      } };
    }
    if (tag === "path" && element.parentNode.getAttribute("class") === "edge") {
      const d = element.getAttribute("d");
      const tokens = d.match(/[A-Za-z]|-?[\d.]+(?:e-?\d+)?/g);
      return { element: element, apply: function (gaps) {
        const out = [];
        for (let i = 0; i < tokens.length; i++) {
          if (/[A-Za-z]/.test(tokens[i])) { out.push(tokens[i]); continue; }
          const x = Number(tokens[i]);
          const y = Number(tokens[i + 1]);
          out.push((x + shiftX(gaps, x, y)) + "," + (y + shiftY(gaps, y)));
          i += 1;
        }
        element.setAttribute("d", out.join(" ").replace(/([A-Za-z]) /g, "$1"));
      } };
    }
    return anchored(element);
  }

  // Moves as a whole with the point it hangs from (text, arrowheads, legend swatches).
  function anchored(element) {
    let x;
    let y;
    if (element.hasAttribute("points")) {
      const b = bounds(pairs(numbers(element.getAttribute("points"))));
      x = (b.x0 + b.x1) / 2;
      y = (b.y0 + b.y1) / 2;
    } else if (element.hasAttribute("x")) {
      x = Number(element.getAttribute("x"));
      y = Number(element.getAttribute("y"));
    } else {
      return null;
    }
    return { element: element, apply: function (gaps) {
      element.setAttribute("transform",
        "translate(" + shiftX(gaps, x, y) + " " + shiftY(gaps, y) + ")");
    } };
  }

  // A cluster's outline grows to hold what moved inside it: its left and top edges move
  // like its top-left corner, its right and bottom edges like its bottom-right corner.
  function stretched(element) {
    const tag = element.tagName;
    if (tag !== "path" && tag !== "polygon") return anchored(element);
    const attribute = tag === "path" ? "d" : "points";
    const original = element.getAttribute(attribute);
    const b = bounds(pairs(numbers(original)));
    const cx = (b.x0 + b.x1) / 2;
    const cy = (b.y0 + b.y1) / 2;
    return { element: element, apply: function (gaps) {
      const left = shiftX(gaps, b.x0, b.y0);
      const top = shiftY(gaps, b.y0);
      const right = shiftX(gaps, b.x1, b.y1);
      const bottom = shiftY(gaps, b.y1);
      let index = 0;
      element.setAttribute(attribute, original.replace(/-?[\d.]+(?:e-?\d+)?/g, function (token) {
        const value = Number(token);
        index += 1;
        if (index % 2 === 1) return value + (value <= cx ? left : right);
        return value + (value <= cy ? top : bottom);
      }));
    } };
  }

  // ------------------------------------------------------------------ pictures and cards
  const placed = new Map(); // node id -> { element, block }

  // One placed picture. ``prefix`` names the boxes of a module template.
  function Block(key, prefix, card) {
    const fragment = data.fragments[key];
    const template = data.templates[key];
    this.key = key;
    this.card = card;
    this.width = fragment.w;
    this.height = fragment.h;
    this.cards = new Map();
    this.group = make("g", { class: "block" });
    this.content = make("g", { transform: "translate(" + fragment.o[0] + " " + fragment.o[1] + ")" },
      this.group);
    this.content.innerHTML = fragment.svg;
    this.nodes = new Map();
    const self = this;
    this.content.querySelectorAll("g.node").forEach(function (g) {
      if (template) g.id = "m-" + joinPath(prefix, template[Number(g.id.slice(1))].name);
    });
    (card ? card.group : root).appendChild(this.group); // measured in the document
    this.movables = Array.prototype.map.call(this.content.children, movable).filter(Boolean);
    this.movables.forEach(function (m) {
      if (m.element.getAttribute("class") !== "node") return;
      self.nodes.set(m.element.id, m);
      placed.set(m.element.id, { element: m.element, block: self });
      decorate(m.element, m.box);
    });
  }

  Block.prototype.layout = function () {
    const gaps = [];
    this.cards.forEach(function (card) {
      const box = card.box;
      gaps.push({ x0: box.x + box.w, top: box.y, y0: box.y + box.h,
                  dx: Math.max(0, card.width - box.w), dy: Math.max(0, card.height - box.h) });
    });
    this.movables.forEach(function (m) { m.apply(gaps); });
    this.cards.forEach(function (card) {
      const box = card.box;
      const x = box.x + shiftX(gaps, box.x, box.y + box.h / 2);
      const y = box.y + shiftY(gaps, box.y);
      card.group.setAttribute("transform", "translate(" + x + " " + y + ")");
    });
    this.width = data.fragments[this.key].w + gaps.reduce(function (s, g) { return s + g.dx; }, 0);
    this.height = data.fragments[this.key].h + gaps.reduce(function (s, g) { return s + g.dy; }, 0);
  };

  Block.prototype.remove = function () {
    this.cards.forEach(function (card) { card.child.remove(); });
    this.nodes.forEach(function (_, id) { placed.delete(id); });
    this.group.remove();
  };

  // An unfolded box: a title bar (click to fold) above the picture it unfolds into.
  function Card(block, id, unfold) {
    const node = block.nodes.get(id);
    this.id = id;
    this.box = node.box;
    this.block = block;
    this.group = make("g", { class: "card" });
    block.content.appendChild(this.group);
    this.frame = make("rect", { rx: 6, ry: 6, class: "card-frame" }, this.group);
    const head = make("g", { class: "card-head" }, this.group);
    head.dataset.fold = id;
    this.bar = make("rect", { rx: 6, ry: 6, height: HEAD, class: "card-bar" }, head);
    const title = make("text", { x: PAD, y: HEAD - 7, class: "card-title" }, head);
    title.textContent = "\u2212 " + unfold.title;
    this.titleWidth = title.getComputedTextLength();
    this.child = new Block(unfold.fragment, unfold.path, this);
    this.child.group.setAttribute("transform", "translate(" + PAD + " " + HEAD + ")");
    node.element.style.display = "none";
  }

  Card.prototype.resize = function () {
    this.width = Math.max(this.box.w, this.child.width, this.titleWidth) + 2 * PAD;
    this.height = HEAD + this.child.height + PAD;
    this.frame.setAttribute("width", this.width);
    this.frame.setAttribute("height", this.height);
    this.bar.setAttribute("width", this.width);
  };

  // The unfolding marker of a box, and the overlay's colour and tooltip.
  function decorate(g, box) {
    const id = g.id;
    if (unfoldOf(id)) {
      g.classList.add("unfoldable");
      const badge = make("g", { class: "badge" }, g);
      make("circle", { cx: box.x + box.w - 1, cy: box.y + 1, r: 6 }, badge);
      make("text", { x: box.x + box.w - 1, y: box.y + 4.5 }, badge).textContent = "+";
    }
    if (!data.overlay) return;
    const instance = instances.get(id);
    const found = data.overlay.nodes[id] || (instance ? data.overlay.paths[instance.path] : null);
    if (!found) return;
    const shape = g.querySelector("polygon, path, ellipse");
    if (shape) shape.setAttribute("fill", colour(found[0]));
    g.classList.add("overlaid");
    make("title", {}, g).textContent = found[1];
  }

  function relayout(block) {
    for (let b = block; b; b = b.card ? b.card.block : null) {
      b.cards.forEach(function (card) { card.resize(); });
      b.layout();
    }
    // the picture's size (the style fills the canvas whatever these say): what a copy of
    // this <svg> saved as a file needs
    svg.setAttribute("width", top.width);
    svg.setAttribute("height", top.height);
  }

  function unfold(id) {
    const where = placed.get(id);
    const spec = unfoldOf(id);
    if (!where || !spec || where.block.cards.has(id)) return;
    const card = new Card(where.block, id, spec);
    where.block.cards.set(id, card);
    relayout(card.child);
  }

  function fold(id) {
    const where = placed.get(id);
    if (!where) return;
    const card = where.block.cards.get(id);
    if (!card) return;
    card.child.remove();
    card.group.remove();
    where.block.cards.delete(id);
    where.element.style.display = "";
    relayout(where.block);
    refresh();
  }

  // ------------------------------------------------------------------ the canvas
  const svg = make("svg", { preserveAspectRatio: "xMidYMid meet" }, canvas);
  const root = make("g", {}, svg);
  const top = new Block(data.root, null, null);
  let view = { x: 0, y: 0, w: top.width, h: top.height };

  function apply() {
    svg.setAttribute("viewBox", view.x + " " + view.y + " " + view.w + " " + view.h);
  }

  function toGraph(clientX, clientY) {
    const point = svg.createSVGPoint();
    point.x = clientX;
    point.y = clientY;
    return point.matrixTransform(svg.getScreenCTM().inverse());
  }

  function zoom(factor, clientX, clientY) {
    const anchor = toGraph(clientX, clientY);
    const width = Math.min(Math.max(view.w * factor, top.width / 400), top.width * 4);
    const scale = width / view.w;
    view = {
      x: anchor.x - (anchor.x - view.x) * scale,
      y: anchor.y - (anchor.y - view.y) * scale,
      w: view.w * scale,
      h: view.h * scale,
    };
    apply();
  }

  canvas.addEventListener("wheel", function (event) {
    event.preventDefault();
    zoom(Math.exp(event.deltaY * 0.0015), event.clientX, event.clientY);
  }, { passive: false });

  let drag = null;
  let dragged = false;
  canvas.addEventListener("pointerdown", function (event) {
    drag = { x: event.clientX, y: event.clientY, start: Object.assign({}, view) };
    dragged = false;
  });
  window.addEventListener("pointermove", function (event) {
    if (!drag) return;
    const dx = event.clientX - drag.x;
    const dy = event.clientY - drag.y;
    if (!dragged && Math.abs(dx) + Math.abs(dy) < 4) return;
    dragged = true;
    canvas.classList.add("panning");
    const ctm = svg.getScreenCTM();
    view.x = drag.start.x - dx / ctm.a;
    view.y = drag.start.y - dy / ctm.d;
    apply();
  });
  window.addEventListener("pointerup", function () {
    drag = null;
    canvas.classList.remove("panning");
  });

  // Centres the view on graph point (cx, cy) at ``scale`` screen pixels per graph unit.
  function look(cx, cy, scale) {
    const w = canvas.clientWidth / scale;
    const h = canvas.clientHeight / scale;
    view = { x: cx - w / 2, y: cy - h / 2, w: w, h: h };
    apply();
  }

  function fit() {
    view = { x: 0, y: 0, w: top.width, h: top.height };
    apply();
  }
  document.getElementById("fit").addEventListener("click", fit);

  // The top of the graph at a readable size: a tall 80-layer chain fitted whole is unreadable.
  function start() {
    const scale = Math.min(1, canvas.clientWidth / top.width);
    look(top.width / 2, canvas.clientHeight / scale / 2, scale);
  }

  function reveal(element) {
    const rect = element.getBoundingClientRect();
    const corner = toGraph(rect.left, rect.top);
    const far = toGraph(rect.right, rect.bottom);
    const width = Math.max(far.x - corner.x, 1);
    const height = Math.max(far.y - corner.y, 1);
    const scale = Math.min(1, 0.8 * canvas.clientWidth / width, 0.8 * canvas.clientHeight / height);
    look((corner.x + far.x) / 2, (corner.y + far.y) / 2, scale);
  }

  // ------------------------------------------------------------------ side panel
  let selected = null;

  function add(parent, tag, text) {
    const child = document.createElement(tag);
    if (text !== undefined) child.textContent = text;
    parent.appendChild(child);
    return child;
  }

  function list(parent, title, items) {
    add(parent, "h3", title + " (" + items.length + ")");
    const ul = add(parent, "ul");
    items.forEach(function (item) { add(ul, "li", item); });
    if (!items.length) add(ul, "li", "none");
  }

  function show(id) {
    const info = infoOf(id);
    if (!info) return;
    if (selected) selected.classList.remove("selected");
    selected = placed.has(id) ? placed.get(id).element : null;
    if (selected) selected.classList.add("selected");
    panel.replaceChildren();
    panel.dataset.node = id;
    add(panel, "h2", info.title);
    const dl = add(panel, "dl");
    info.fields.forEach(function (field) {
      add(dl, "dt", field[0]);
      add(dl, "dd", field[1]);
    });
    const subgraph = info.subgraph === null ? null : data.subgraphs[String(info.subgraph)];
    if (subgraph) {
      const targets = subgraph.targets.length ? subgraph.targets.join(", ") : "head";
      add(panel, "h3", "Subgraph #" + subgraph.index + " · " + targets);
      list(panel, "Inputs", subgraph.inputs);
      list(panel, "Consumed (dropped from the cache after it)", subgraph.consumed);
      list(panel, "Outputs", subgraph.outputs);
    }
  }

  svg.addEventListener("click", function (event) {
    if (dragged) return;
    const head = event.target.closest("g.card-head");
    if (head) { fold(head.dataset.fold); return; }
    const g = event.target.closest("g.node");
    if (!g) return;
    show(g.id);
    if (unfoldOf(g.id)) { unfold(g.id); refresh(); }
  });

  document.getElementById("fold-all").addEventListener("click", function () {
    Array.from(top.cards.keys()).forEach(fold);
  });

  // ------------------------------------------------------------------ search
  // Every node the page can show is searchable, placed or not: a match inside a folded part
  // is revealed by unfolding its ancestors, outermost first.
  const haystacks = new Map();
  function index(id, info) {
    const words = [info.title].concat(info.fields.map(function (f) { return f[1]; }));
    haystacks.set(id, words.join("\n").toLowerCase());
  }
  Object.keys(data.nodes).forEach(function (id) { index(id, data.nodes[id]); });
  instances.forEach(function (info, id) { index(id, info); });
  let matches = [];
  let matched = new Set();
  let current = -1;

  function refresh() {
    placed.forEach(function (where, id) { where.element.classList.toggle("match", matched.has(id)); });
  }

  function find(query) {
    const needle = query.trim().toLowerCase();
    matches = [];
    current = -1;
    if (needle) {
      haystacks.forEach(function (text, id) { if (text.indexOf(needle) >= 0) matches.push(id); });
    }
    matched = new Set(matches);
    refresh();
    svg.classList.toggle("searching", needle.length > 0);
    count.textContent = needle ? matches.length + (matches.length === 1 ? " match" : " matches") : "";
  }

  function ancestors(id) {
    const chain = [];
    for (let p = parentOf(id); p; p = parentOf(p)) chain.unshift(p);
    return chain;
  }

  function step(direction) {
    if (!matches.length) return;
    current = (current + direction + matches.length) % matches.length;
    const id = matches[current];
    ancestors(id).forEach(unfold);
    refresh();
    if (placed.has(id)) reveal(placed.get(id).element);
    show(id);
    count.textContent = (current + 1) + " of " + matches.length;
  }

  search.addEventListener("input", function () { find(search.value); });
  search.addEventListener("keydown", function (event) {
    if (event.key === "Enter") step(event.shiftKey ? -1 : 1);
    if (event.key === "Escape") { search.value = ""; find(""); }
  });
  document.getElementById("next").addEventListener("click", function () { step(1); });
  document.getElementById("prev").addEventListener("click", function () { step(-1); });
  document.addEventListener("keydown", function (event) {
    if (event.key === "/" && document.activeElement !== search) {
      event.preventDefault();
      search.focus();
    }
  });

  // ------------------------------------------------------------------ overlay legend
  function colour(value) {
    const stops = data.overlay.scale;
    const at = Math.min(Math.max(value, 0), 1) * (stops.length - 1);
    const low = Math.floor(at);
    const high = Math.min(low + 1, stops.length - 1);
    const mix = at - low;
    const channel = function (hex, i) { return parseInt(hex.slice(1 + 2 * i, 3 + 2 * i), 16); };
    let out = "#";
    for (let i = 0; i < 3; i++) {
      const c = Math.round(channel(stops[low], i) * (1 - mix) + channel(stops[high], i) * mix);
      out += (c < 16 ? "0" : "") + c.toString(16);
    }
    return out;
  }

  if (data.overlay) {
    const legend = document.getElementById("legend");
    add(legend, "span", data.overlay.label + ":");
    add(legend, "span", data.overlay.low);
    add(legend, "span").className = "scale";
    legend.lastChild.style.background = "linear-gradient(to right, " + data.overlay.scale.join(", ") + ")";
    add(legend, "span", data.overlay.high);
  }
  if (!Object.keys(data.unfolds).length) document.getElementById("fold-all").hidden = true;

  // ------------------------------------------------------------------ decisions
  // Every branch of model code the trace took, as `attempt --decisions` lists them.
  const decisionsButton = document.getElementById("decisions");
  decisionsButton.hidden = !data.decisions.length;
  decisionsButton.addEventListener("click", function () {
    panel.textContent = "";
    delete panel.dataset.node;
    add(panel, "h3", "Decisions (" + data.decisions.length + ")");
    data.decisions.forEach(function (d) {
      const item = add(panel, "div");
      item.className = "decision st-" + d.status;
      add(item, "div", d.status + " · " + d.kind + " · " + d.file + ":" + d.line).className = "where";
      add(item, "code", d.source);
      const taken = Object.keys(d.taken).map(function (k) { return k + " ×" + d.taken[k]; });
      add(item, "div", "took " + taken.join(", ") + "; " + d.decided_by);
      add(item, "div", "flips: " + d.flips).className = "flips";
    });
  });

  // "#unfold=<id>,<id>" opens the page with those nodes unfolded, and what hides them: a
  // link to one layer's operations, or a picture saved from `chromium --dump-dom`.
  const wanted = /unfold=([^&]*)/.exec(location.hash);
  const unfolded = wanted ? decodeURIComponent(wanted[1]).split(",") : [];
  data.initial.concat(unfolded).forEach(function (id) { ancestors(id).concat([id]).forEach(unfold); });
  relayout(top);
  start();
})();
