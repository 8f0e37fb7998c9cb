// Live views: an element with data-live names a stream of server-sent
// events whose data is the element's new HTML, rendered and escaped by the
// server. EventSource reconnects on its own when a stream ends.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("[data-live]").forEach(function (el) {
    var es = new EventSource(el.getAttribute("data-live"));
    es.addEventListener(el.getAttribute("data-event"), function (e) {
      el.innerHTML = e.data;
    });
  });
});
