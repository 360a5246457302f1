// millpond admin: progressive enhancements. Every page works without this
// script except the overview's automatic refresh. No inline script is
// allowed by the Content-Security-Policy, so everything is wired here.
(function () {
  "use strict";

  // The overview grid refreshes itself: the server renders the table, this
  // swaps it in when it changed, and the status line (an aria-live region)
  // is updated only when the totals change, so screen readers hear changes
  // rather than every refresh.
  function setupRefresh() {
    var grid = document.getElementById("grid");
    if (!grid) { return; }
    var url = grid.getAttribute("data-refresh-url");
    var ms = parseInt(grid.getAttribute("data-refresh-ms"), 10);
    if (!url || !(ms > 0)) { return; }
    var summary = document.getElementById("summary");
    var toggle = document.getElementById("refresh-toggle");
    var paused = false;
    var timer = null;

    function schedule() {
      if (!paused) { timer = window.setTimeout(refresh, ms); }
    }
    function refresh() {
      grid.setAttribute("aria-busy", "true");
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (resp) {
          if (!resp.ok) { throw new Error("HTTP " + resp.status); }
          return resp.text();
        })
        .then(function (html) {
          var doc = new DOMParser().parseFromString(html, "text/html");
          var table = doc.getElementById("backlog");
          var src = doc.querySelector("[data-summary]");
          if (table) {
            var focused = document.activeElement && grid.contains(document.activeElement);
            if (!focused) {
              grid.replaceChildren.apply(grid, Array.prototype.slice.call(doc.body.childNodes).map(function (n) {
                return document.adoptNode(n);
              }));
            }
          }
          if (src && summary && summary.textContent !== src.textContent) {
            summary.textContent = src.textContent;
          }
          grid.removeAttribute("data-stale");
        })
        .catch(function () {
          grid.setAttribute("data-stale", "true");
          if (summary) { summary.textContent = "Could not refresh the table; it shows older data. Retrying."; }
        })
        .finally(function () {
          grid.setAttribute("aria-busy", "false");
          schedule();
        });
    }
    if (toggle) {
      toggle.hidden = false;
      toggle.addEventListener("click", function () {
        paused = !paused;
        toggle.setAttribute("aria-pressed", paused ? "true" : "false");
        toggle.textContent = paused ? "Resume auto-refresh" : "Pause auto-refresh";
        if (paused) { window.clearTimeout(timer); } else { refresh(); }
      });
    }
    schedule();
  }

  // "Select every dead letter on this page".
  function setupSelectAll() {
    var all = document.getElementById("select-all");
    if (!all) { return; }
    var boxes = document.querySelectorAll("input.row-select");
    if (boxes.length === 0) { return; }
    all.hidden = false;
    all.addEventListener("change", function () {
      boxes.forEach(function (b) { b.checked = all.checked; });
    });
  }

  // An action form is sent once: a second click (a double click, an
  // impatient one) would send it again, and the page would show the
  // second answer, which finds nothing left to do ("0 of 1", "nothing was
  // changed") although the first did it.
  function setupSubmitOnce() {
    document.querySelectorAll("form[method=post]").forEach(function (form) {
      var sent = false;
      form.addEventListener("submit", function (e) {
        if (sent) { e.preventDefault(); return; }
        sent = true;
        form.setAttribute("aria-busy", "true");
      });
      // Back to this page from the browser's cache: it may be sent again.
      window.addEventListener("pageshow", function (e) {
        if (!e.persisted) { return; }
        sent = false;
        form.removeAttribute("aria-busy");
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    setupRefresh();
    setupSelectAll();
    setupSubmitOnce();
  });
})();
