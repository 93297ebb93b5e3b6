// The operator page's own script (no inline script anywhere: CSP script-src 'self').
// - Pauses the pages' refreshes (elements of class "poll") on the operator's word, while a
//   form field has the focus, or while a dialog is open.
// - Asks before a form marked data-confirm is sent.
(function () {
  "use strict";
  var paused = false;

  function busy() {
    var active = document.activeElement;
    if (active && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName)) return true;
    return document.querySelector("dialog[open]") !== null;
  }

  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail.elt;
    var polled = elt && elt.classList && elt.classList.contains("poll");
    var first = event.detail.requestConfig && event.detail.requestConfig.triggeringEvent &&
      event.detail.requestConfig.triggeringEvent.type === "load";
    if (polled && !first && (paused || busy())) event.preventDefault();
  });

  document.addEventListener("click", function (event) {
    var toggle = event.target.closest && event.target.closest("#poll-toggle");
    if (!toggle) return;
    paused = !paused;
    toggle.textContent = paused ? "resume refresh" : "pause refresh";
  });

  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });
})();
