// Live views: an element with data-live names a stream of server-sent
// events, and data-event the event whose data is the element's new HTML,
// rendered and escaped by the server. Elements that name one stream share
// one connection. EventSource reconnects on its own when a stream ends.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  var sources = {};
  document.querySelectorAll("[data-live]").forEach(function (el) {
    var url = el.getAttribute("data-live");
    if (!sources[url]) {
      sources[url] = new EventSource(url);
    }
    sources[url].addEventListener(el.getAttribute("data-event"), function (e) {
      el.innerHTML = e.data;
    });
  });
});
