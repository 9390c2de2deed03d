// llmc-trace graph viewer: pan and zoom the inline SVG, search nodes, show a node's details.
// Reads the facts the Python side wrote into <script id="llmc-data">; loads nothing.
(function () {
  "use strict";

  const data = JSON.parse(document.getElementById("llmc-data").textContent);
  const canvas = document.getElementById("canvas");
  const svg = canvas.querySelector("svg");
  const panel = document.getElementById("panel");
  const search = document.getElementById("search");
  const count = document.getElementById("search-count");

  // ------------------------------------------------------------------ pan and zoom
  const box = svg.viewBox.baseVal;
  const initial = { x: box.x, y: box.y, w: box.width, h: box.height };
  let view = Object.assign({}, initial);
  svg.removeAttribute("width");
  svg.removeAttribute("height");
  svg.setAttribute("preserveAspectRatio", "xMidYMid meet");

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
    const width = Math.min(Math.max(view.w * factor, initial.w / 400), initial.w * 4);
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
    view = Object.assign({}, initial);
    apply();
  }

  // The top of the graph at a readable size: a tall 80-layer chain fitted whole is unreadable.
  function start() {
    const scale = Math.min(1, canvas.clientWidth / initial.w);
    look(initial.x + initial.w / 2, initial.y + canvas.clientHeight / scale / 2, scale);
  }
  document.getElementById("fit").addEventListener("click", fit);

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
  const elements = new Map();
  svg.querySelectorAll("g.node").forEach(function (g) { elements.set(g.id, g); });
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
    const info = data.nodes[id];
    if (!info) return;
    if (selected) selected.classList.remove("selected");
    selected = elements.get(id) || null;
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
    const g = event.target.closest("g.node");
    if (g) show(g.id);
  });

  // ------------------------------------------------------------------ search
  const haystacks = new Map();
  Object.keys(data.nodes).forEach(function (id) {
    const info = data.nodes[id];
    const words = [info.title].concat(info.fields.map(function (f) { return f[1]; }));
    haystacks.set(id, words.join("\n").toLowerCase());
  });
  let matches = [];
  let current = -1;

  function find(query) {
    const needle = query.trim().toLowerCase();
    elements.forEach(function (g) { g.classList.remove("match"); });
    matches = [];
    current = -1;
    if (needle) {
      haystacks.forEach(function (text, id) {
        if (text.indexOf(needle) >= 0 && elements.has(id)) matches.push(id);
      });
      matches.forEach(function (id) { elements.get(id).classList.add("match"); });
    }
    svg.classList.toggle("searching", needle.length > 0);
    count.textContent = needle ? matches.length + (matches.length === 1 ? " match" : " matches") : "";
  }

  function step(direction) {
    if (!matches.length) return;
    current = (current + direction + matches.length) % matches.length;
    const id = matches[current];
    reveal(elements.get(id));
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

  start();
})();
