(function () {
  "use strict";
  var config = {displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"]};
  var nodes = document.querySelectorAll("[data-figure]");
  for (var i = 0; i < nodes.length; i++) {
    var el = nodes[i];
    var source = document.getElementById(el.getAttribute("data-figure") + "-data");
    try {
      if (typeof Plotly === "undefined") { throw new Error("plotly.js is not loaded"); }
      var fig = JSON.parse(source.textContent);
      Plotly.newPlot(el, fig.data, fig.layout, config);
    } catch (err) {
      el.className += " plot-error";
      el.textContent = "This chart could not be drawn: " + err.message;
      console.error("traceanalyzer report: " + err.message);
    }
  }
})();
