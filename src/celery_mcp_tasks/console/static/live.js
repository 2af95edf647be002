/* The task console's one script: live updates over SSE, the theme toggle, j/k keys, relative times.
 *
 * Every page reads fine without it. With it:
 *  - the list (/tasks) follows GET <root>/api/events (`event: task`, data: a row's JSON, or {key, deleted}):
 *    a row on the page gets its status, message and progress in place; on the first page of the newest-first
 *    order a new task that matches the filter is inserted at the top, rendered by the server
 *    (GET <root>/tasks/<key>/row?<filter>: a <tr>, or 204 when the row does not match the filter);
 *  - a task page (/tasks/<key>) moves its status, message and progress bar as the task changes;
 *  - the overview counts the changes since it was loaded and offers a refresh.
 * No framework, nothing from a CDN.
 */
(function () {
  "use strict";

  var root = document.body.getAttribute("data-root") || "";
  var THEME_KEY = "mcp-tasks-console-theme";

  // -- theme: system (no attribute), light or dark; remembered in this browser ---------------------------
  function applyTheme(theme) {
    if (theme === "light" || theme === "dark") {
      document.documentElement.setAttribute("data-theme", theme);
    } else {
      document.documentElement.removeAttribute("data-theme");
    }
  }
  function storedTheme() {
    try { return window.localStorage.getItem(THEME_KEY) || "system"; } catch (e) { return "system"; }
  }
  applyTheme(storedTheme());
  var toggle = document.querySelector(".theme-toggle");
  if (toggle) {
    var label = function (theme) {
      toggle.textContent = "Theme: " + theme;
      toggle.setAttribute("aria-pressed", theme === "system" ? "false" : "true");
    };
    label(storedTheme());
    toggle.hidden = false;
    toggle.addEventListener("click", function () {
      var order = ["system", "light", "dark"];
      var next = order[(order.indexOf(storedTheme()) + 1) % order.length];
      try { window.localStorage.setItem(THEME_KEY, next); } catch (e) { /* private mode: this page only */ }
      applyTheme(next);
      label(next);
    });
  }

  // -- relative times, as the server renders them ------------------------------------------------------------
  function ago(ms) {
    var s = Math.round((Date.now() - ms) / 1000);
    var future = s < 0;
    s = Math.abs(s);
    var text;
    if (s < 5) return "just now";
    if (s < 60) text = s + "s";
    else if (s < 3600) text = Math.floor(s / 60) + " min";
    else if (s < 86400) text = Math.floor(s / 3600) + " h";
    else text = Math.floor(s / 86400) + " d";
    return future ? "in " + text : text + " ago";
  }
  function refreshTimes() {
    var times = document.querySelectorAll("time[data-ms]");
    for (var i = 0; i < times.length; i++) {
      times[i].textContent = ago(parseInt(times[i].getAttribute("data-ms"), 10));
    }
  }
  window.setInterval(refreshTimes, 15000);

  // -- keyboard: j/k walk the list's rows, / goes to the text filter ------------------------------------------
  function typing(target) {
    var tag = target && target.tagName;
    return tag === "INPUT" || tag === "SELECT" || tag === "TEXTAREA" || (target && target.isContentEditable);
  }
  document.addEventListener("keydown", function (event) {
    if (event.altKey || event.ctrlKey || event.metaKey || typing(event.target)) return;
    if (event.key === "/") {
      var search = document.querySelector("form.filters input[name=q]");
      if (search) { event.preventDefault(); search.focus(); }
      return;
    }
    if (event.key !== "j" && event.key !== "k") return;
    var links = Array.prototype.slice.call(document.querySelectorAll("#rows a.key"));
    if (!links.length) return;
    var at = links.indexOf(document.activeElement);
    var next = event.key === "j" ? (at < 0 ? 0 : Math.min(at + 1, links.length - 1)) : (at < 0 ? 0 : Math.max(at - 1, 0));
    var previous = document.querySelector("tr.focused");
    if (previous) previous.classList.remove("focused");
    links[next].focus();
    links[next].closest("tr").classList.add("focused");
    event.preventDefault();
  });

  // -- live updates -----------------------------------------------------------------------------------------
  var listMode = document.body.getAttribute("data-live-list");  // "insert" | "update" | null
  var taskKey = document.body.getAttribute("data-live-task");
  var overview = document.body.getAttribute("data-page") === "overview";
  var state = document.getElementById("live-state");
  if (!window.EventSource || (!listMode && !taskKey && !overview)) return;

  function setState(on, text) {
    if (!state) return;
    state.setAttribute("data-state", on ? "on" : "off");
    state.textContent = text;
  }

  function number(value) {
    return Math.round(value) === value ? String(value) : String(Math.round(value * 100) / 100);
  }

  // Status, message, progress and "updated" of one row or of the task page, from the event's data.
  function patch(container, data) {
    if (data.status) {
      var badge = container.querySelector(".cell-status .status");
      if (badge) {
        badge.className = "status status-" + data.status;
        badge.textContent = data.status.replace("_", " ");
      }
      if (container.setAttribute) container.setAttribute("data-status", data.status);
    }
    if ("status_message" in data) {
      var message = container.querySelector(".cell-message");
      if (message) message.textContent = data.status_message || "";
    }
    var cell = container.querySelector(".cell-progress");
    if (cell && "progress" in data && data.progress !== null && data.progress !== undefined) {
      var bar = cell.querySelector("progress");
      var text = cell.querySelector(".progress-text");
      if (!bar || !text) {  // the first report: the bar is made here, as the server renders it
        var wide = cell.tagName === "P";
        cell.textContent = "";
        bar = document.createElement("progress");
        if (wide) bar.className = "wide";
        text = document.createElement("span");
        text.className = "progress-text";
        cell.appendChild(bar);
        cell.appendChild(document.createTextNode(" "));
        cell.appendChild(text);
      }
      if (data.progress_total) {
        bar.max = data.progress_total;
        bar.value = data.progress;
        bar.setAttribute("aria-label", "Progress");
        text.textContent = number(data.progress) + "/" + number(data.progress_total);
      } else {
        bar.removeAttribute("value");
        bar.setAttribute("aria-label", "Progress (total unknown)");
        text.textContent = number(data.progress);
      }
    }
    if ("updated_at" in data) {
      var updated = container.querySelector(".cell-updated time");
      if (updated) {
        updated.setAttribute("data-ms", data.updated_at);
        updated.textContent = ago(data.updated_at);
      }
    }
  }

  // A notice at the top of the page (made once), ending in a link that reloads it.
  function notice(id, text, link) {
    var main = document.getElementById("main");
    var shown = document.getElementById(id);
    if (!shown) {
      shown = document.createElement("p");
      shown.id = id;
      shown.className = "notice";
      shown.setAttribute("role", "status");
      main.insertBefore(shown, main.firstChild);
    }
    shown.textContent = text;
    var again = document.createElement("a");
    again.href = window.location.pathname;
    again.textContent = link;
    shown.appendChild(again);
  }

  // The server-rendered row, or null when it does not match this page's filter (204).
  function fetchRow(key) {
    var url = root + "/tasks/" + encodeURIComponent(key) + "/row" + window.location.search;
    return window.fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } }).then(function (response) {
      if (response.status !== 200) return null;
      return response.text().then(function (html) {
        var holder = document.createElement("template");
        holder.innerHTML = html.trim();
        var row = holder.content.firstElementChild;
        return row && row.tagName === "TR" ? row : null;
      });
    });
  }

  function newestShown(tbody) {
    var newest = parseInt(document.body.getAttribute("data-since") || "0", 10) - 5000;  // an empty page: since it was rendered
    var rows = tbody.querySelectorAll("tr[data-created]");
    for (var i = 0; i < rows.length; i++) {
      newest = Math.max(newest, parseInt(rows[i].getAttribute("data-created"), 10));
    }
    return newest;
  }

  function onListEvent(data, key) {
    var tbody = document.getElementById("rows");
    if (!tbody) return;
    var row = document.getElementById("row-" + key);
    if (data.deleted) {
      if (row) row.parentNode.removeChild(row);
      return;
    }
    if (row) {
      var known = parseInt(row.getAttribute("data-version") || "0", 10);
      if (data.version && data.version <= known) return;
      patch(row, data);
      if (data.version) row.setAttribute("data-version", data.version);
      return;
    }
    if (listMode !== "insert") return;
    // Only a task newer than every row shown belongs at the top: an older one that changed is further down
    // the list (on a later page), never inserted here.
    if (typeof data.created_at === "number" && data.created_at < newestShown(tbody)) return;
    var wanted = (document.body.getAttribute("data-filter-status") || "").split(",").filter(Boolean);
    if (data.status && wanted.length && wanted.indexOf(data.status) < 0) return;
    var tool = document.body.getAttribute("data-filter-tool");
    if (tool && data.tool && data.tool !== tool) return;
    fetchRow(key).then(function (fresh) {
      if (!fresh || document.getElementById(fresh.id)) return;
      fresh.classList.add("fresh");
      tbody.insertBefore(fresh, tbody.firstElementChild);
      var empty = document.querySelector(".empty");
      if (empty) empty.hidden = true;
    });
  }

  function onTaskEvent(data) {
    if (data.deleted) {
      data = { status: "deleted" };
    }
    var known = parseInt(document.body.getAttribute("data-version") || "0", 10);
    if (data.version && data.version <= known) return;
    if (data.version) document.body.setAttribute("data-version", data.version);
    var before = document.body.getAttribute("data-status");
    if (data.status !== "deleted") patch(document.getElementById("main"), data);
    if (data.status && data.status !== before) {
      document.body.setAttribute("data-status", data.status);
      var final = ["completed", "failed", "cancelled", "deleted"].indexOf(data.status) >= 0;
      if (final) {
        var stale = document.querySelectorAll(data.status === "deleted" ? ".actions form" : ".action-cancel, .action-resend");
        for (var i = 0; i < stale.length; i++) stale[i].hidden = true;
      }
      notice("status-changed", "The task is now " + data.status.replace("_", " ") + ". ", "Reload for the actions that apply");
    }
  }

  var changes = 0;
  function onOverviewEvent() {
    changes += 1;
    notice("changes", changes + (changes === 1 ? " change" : " changes") + " since this page was loaded. ", "Refresh");
  }

  var source = new EventSource(root + "/api/events", { withCredentials: true });
  source.addEventListener("open", function () { setState(true, "Live updates on"); });
  source.addEventListener("error", function () {
    setState(false, source.readyState === EventSource.CLOSED ? "Live updates off" : "Live updates reconnecting…");
  });
  source.addEventListener("task", function (event) {
    var data;
    try { data = JSON.parse(event.data); } catch (e) { return; }
    var key = data.key || data.row;
    if (!key || !/^[0-9a-f]{64}$/.test(key)) return;  // the full row key, never anything else
    if (taskKey) {
      if (key === taskKey) onTaskEvent(data);
    } else if (listMode) {
      onListEvent(data, key);
    } else if (overview) {
      onOverviewEvent();
    }
  });
})();
