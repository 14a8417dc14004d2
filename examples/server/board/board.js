// The board's live view: polls /board/feed.json. Without a key it reads
// the public health snapshot (served from the store's cache, so a poll
// costs nothing until the namespace changes); with a key it also asks,
// at most once per snapshot lifetime, for the audited details.
(function () {
  "use strict";
  var FAST = 2000;      // the snapshot and admission
  var DETAILS = 15000;  // audited reads: no more often than the snapshot is kept
  var ns = document.body.getAttribute("data-namespace") || "";
  var form = document.getElementById("key-form");
  var keyInput = document.getElementById("key");
  var lastDetails = 0;

  function key() { return sessionStorage.getItem("tessera-key") || ""; }

  function text(el, value) { if (el) { el.textContent = value == null ? "–" : String(value); } }

  function cell(row, value) {
    var td = document.createElement("td");
    td.textContent = value == null ? "" : String(value);
    row.appendChild(td);
    return td;
  }

  function request(path, options) {
    options = options || {};
    options.headers = options.headers || {};
    if (key()) { options.headers["Authorization"] = "Bearer " + key(); }
    return fetch(path, options).then(function (response) {
      return response.json().then(function (body) {
        if (!response.ok) { throw new Error((body.error && body.error.message) || response.status); }
        return body;
      });
    });
  }

  function act(task, what) {
    var path = "/v1/ns/" + encodeURIComponent(task.namespace) + "/tasks/" +
      encodeURIComponent(task.id) + "/" + what;
    request(path, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ version: task.version })
    }).then(function () { lastDetails = 0; poll(); }, function (error) { alert(what + ": " + error.message); });
  }

  function showDetails(feed) {
    text(document.getElementById("account"), feed.account);
    text(document.getElementById("grants"), (feed.grants || []).join(", "));
    if (feed.oldest_ready !== undefined) {
      var oldest = feed.oldest_ready;
      text(document.getElementById("oldest"), oldest ?
        oldest.task.id + " v" + oldest.task.version + " (queue " + oldest.queue + ", attempt " + oldest.attempt + ")" :
        "none");
    }
    if (feed.discarded) {
      var body = document.getElementById("discarded");
      body.textContent = "";
      feed.discarded.forEach(function (row) {
        var tr = document.createElement("tr");
        cell(tr, row.task.id + " v" + row.task.version);
        cell(tr, row.attempt);
        cell(tr, row.tries);
        cell(tr, row.state && row.state.reason);
        cell(tr, row.last_error);
        var buttons = cell(tr, "");
        ["retry", "cancel"].forEach(function (what) {
          var button = document.createElement("button");
          button.textContent = what;
          button.setAttribute("data-action", what);
          button.addEventListener("click", function () { act(row.task, what); });
          buttons.appendChild(button);
        });
        body.appendChild(tr);
      });
    }
    if (feed.audit) {
      var events = document.getElementById("events");
      events.textContent = "";
      feed.audit.events.forEach(function (event) {
        var tr = document.createElement("tr");
        cell(tr, event.time); cell(tr, event.action); cell(tr, event.outcome); cell(tr, event.resource);
        events.appendChild(tr);
      });
      var counters = document.getElementById("counters");
      counters.textContent = "";
      feed.audit.counters.forEach(function (counter) {
        var tr = document.createElement("tr");
        cell(tr, counter.minute); cell(tr, counter.action); cell(tr, counter.outcome); cell(tr, counter.count);
        counters.appendChild(tr);
      });
    }
  }

  // How long ago `at` was, in the server page's words.
  function age(at) {
    var seconds = Math.max(0, Math.floor((Date.now() - Date.parse(at)) / 1000));
    var minutes = Math.floor(seconds / 60), hours = Math.floor(seconds / 3600), days = Math.floor(seconds / 86400);
    if (seconds < 60) { return seconds + " s"; }
    if (minutes < 60) { return minutes + " min " + (seconds % 60) + " s"; }
    if (hours < 24) { return hours + " h " + (minutes % 60) + " min"; }
    return days + " d " + (hours % 24) + " h";
  }

  function showWaiting(depths) {
    var body = document.querySelector("table.waiting tbody");
    if (!body || !depths) { return; }
    body.textContent = "";
    depths.forEach(function (depth) {
      var tr = document.createElement("tr");
      tr.setAttribute("data-queue", depth.queue);
      var th = document.createElement("th");
      th.setAttribute("scope", "row");
      th.textContent = depth.queue;
      tr.appendChild(th);
      cell(tr, depth.ready); cell(tr, depth.delayed); cell(tr, depth.leased);
      cell(tr, depth.oldest_ready_at ? age(depth.oldest_ready_at) + " ago" : "–").setAttribute("data-field", "oldest");
      body.appendChild(tr);
    });
  }

  function show(feed) {
    var health = feed.health;
    if (health) {
      showWaiting(health.depths);
      Object.keys(health.attempts).forEach(function (state) {
        text(document.querySelector('[data-count="' + state + '"]'), health.attempts[state]);
      });
      text(document.querySelector('[data-count="expired_leases"]'), health.expired_leases);
      text(document.getElementById("taken"), health.taken_at);
    }
    Object.keys(feed.admission).forEach(function (field) {
      text(document.querySelector('[data-admission="' + field + '"]'), feed.admission[field]);
    });
    document.getElementById("refused").hidden = !feed.writes_refused;
    var retention = feed.retention || {};
    ["ran_at", "tasks_purged", "rows_deleted"].forEach(function (field) {
      text(document.querySelector('[data-retention="' + field + '"]'), retention[field]);
    });
    if (feed.account !== undefined) {
      document.getElementById("keyed").hidden = false;
      showDetails(feed);
    }
    text(document.getElementById("live"), "updated " + new Date().toISOString());
  }

  function poll() {
    var path = "/board/feed.json" + (ns ? "?ns=" + encodeURIComponent(ns) : "");
    var now = Date.now();
    if (key() && now - lastDetails >= DETAILS) {
      path += (ns ? "&" : "?") + "details=1";
      lastDetails = now;
    }
    return request(path).then(show, function (error) {
      text(document.getElementById("live"), "error: " + error.message);
    });
  }

  // The key is kept in this tab for the live panel, and posted to the
  // board too, which keeps it in its cookie for the server-rendered views.
  function post(path, fields) {
    return fetch(path, {
      method: "POST",
      body: new URLSearchParams(fields),
      redirect: "manual",
      credentials: "same-origin"
    }).catch(function () {});
  }

  if (form) {
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var typed = keyInput.value.trim();
      sessionStorage.setItem("tessera-key", typed);
      keyInput.value = "";
      lastDetails = 0;
      post("/board/key", ns ? { key: typed, ns: ns } : { key: typed });
      poll();
    });
  }
  document.getElementById("forget").addEventListener("click", function () {
    sessionStorage.removeItem("tessera-key");
    document.getElementById("keyed").hidden = true;
    post("/board/forget", {});
  });

  poll();
  setInterval(poll, FAST);
})();
