// llmc-trace compression report: click a box of the overview to list its layers, a column
// header to sort by it. Reads the box titles the Python side wrote into
// <script id="report-boxes">; loads nothing.
(function () {
  "use strict";

  const boxes = JSON.parse(document.getElementById("report-boxes").textContent);
  const table = document.getElementById("layer-table");
  const body = table.tBodies[0];
  const filter = document.getElementById("filter");
  const filterText = document.getElementById("filter-text");

  // ------------------------------------------------------------------ one box's layers
  function showBox(id) {
    let shown = 0;
    Array.from(body.rows).forEach(function (row) {
      const match = id === null || row.dataset.group === id;
      row.hidden = !match;
      if (match) shown += 1;
    });
    filter.hidden = id === null;
    filterText.textContent = id === null ? "" : shown + " of the layers, in " + boxes[id];
    document.querySelectorAll("#overview g.node").forEach(function (node) {
      node.classList.toggle("selected", node.id === id);
    });
  }

  document.querySelectorAll("#overview g.node").forEach(function (node) {
    node.addEventListener("click", function (event) {
      if (event.target.closest("a")) return; // a layer's cell links to its row instead
      if (Object.prototype.hasOwnProperty.call(boxes, node.id)) showBox(node.id);
    });
  });
  document.getElementById("show-all").addEventListener("click", function () { showBox(null); });
  window.addEventListener("hashchange", function () { showBox(null); });

  // ------------------------------------------------------------------ sorting
  let sorted = { column: -1, descending: false };
  Array.from(table.tHead.rows[0].cells).forEach(function (header, column) {
    header.addEventListener("click", function () {
      const numeric = header.dataset.kind === "number";
      const descending = sorted.column === column ? !sorted.descending : numeric;
      const sign = descending ? -1 : 1;
      const rows = Array.from(body.rows);
      rows.sort(function (a, b) {
        const x = a.cells[column].dataset.value;
        const y = b.cells[column].dataset.value;
        if (x === "" || y === "") return (x === "") - (y === ""); // blanks last either way
        if (numeric) return sign * (Number(x) - Number(y));
        return sign * x.localeCompare(y);
      });
      rows.forEach(function (row) { body.appendChild(row); });
      sorted = { column: column, descending: descending };
      Array.from(table.tHead.rows[0].cells).forEach(function (cell, i) {
        cell.dataset.sorted = i === column ? (descending ? "descending" : "ascending") : "";
      });
    });
  });
})();
