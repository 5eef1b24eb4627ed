// Queen's dashboard: one page, hash routes, the JSON API with the signed-in token.
// Every text the server sends is set with textContent: names are chosen by users.
"use strict";

const TOKEN_KEY = "queen.token";
const $ = (id) => document.getElementById(id);

// -- calling the API -------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(method, path, body) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers["Authorization"] = "Bearer " + token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {method, headers, body: body === undefined ? undefined : JSON.stringify(body)});
  } catch (error) {
    throw new ApiError(0, "the server did not answer: " + error.message);
  }
  let document = null;
  try {
    document = await response.json();
  } catch (error) {
    document = null;
  }
  if (!response.ok) {
    // A refusal is {"error": "<message>", "code", "details", "detail"}.
    const message = document && typeof document.error === "string" ? document.error : response.statusText;
    throw new ApiError(response.status, message);
  }
  return document;
}

function query(params) {
  const parts = [];
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") {
      parts.push(encodeURIComponent(name) + "=" + encodeURIComponent(value));
    }
  }
  return parts.length ? "?" + parts.join("&") : "";
}

// -- what the user sees ----------------------------------------------------------------------------

const LABELS = {401: "Not signed in (401)", 403: "Forbidden (403)"};

function notify(text, kind) {
  const notice = $("notice");
  notice.textContent = text;
  notice.className = kind || "error";
  notice.hidden = false;
}

function clearNotice() {
  $("notice").hidden = true;
}

function showError(error) {
  if (error instanceof ApiError) {
    const label = LABELS[error.status] || (error.status ? "Error " + error.status : "Error");
    notify(label + ": " + error.message, "error");
    if (error.status === 401) showSignIn();
  } else {
    notify("Error: " + error.message, "error");
  }
}

// el("td", {className: "x"}, "text", child): strings become text nodes, never markup.
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  Object.assign(node, props || {});
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function utc(ms) {
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

function relative(ms) {
  const seconds = Math.round((ms - Date.now()) / 1000);
  const size = Math.abs(seconds);
  if (size === 0) return "now";
  let text;
  if (size < 120) text = size + " s";
  else if (size < 3600) text = Math.floor(size / 60) + " min " + (size % 60) + " s";
  else if (size < 172800) text = Math.floor(size / 3600) + " h " + Math.floor(size % 3600 / 60) + " min";
  else text = Math.floor(size / 86400) + " days";
  return seconds > 0 ? "in " + text : text + " ago";
}

function plural(count, word) {
  return count + " " + word + (count === 1 ? "" : "s");
}

// A time cell: relative (kept current by the ticker below) above the absolute UTC time.
function when(ms) {
  if (ms === null || ms === undefined) return el("td", {className: "muted"}, "—");
  const rel = el("span", {className: "rel"}, relative(ms));
  rel.dataset.at = String(ms);
  return el("td", {className: "time"}, rel, el("span", {className: "abs"}, utc(ms)));
}

function age(ms) {
  if (ms === null || ms === undefined) return el("td", {className: "muted"}, "—");
  return when(ms);
}

setInterval(() => {
  for (const node of document.querySelectorAll(".rel[data-at]")) {
    node.textContent = relative(Number(node.dataset.at));
  }
}, 1000);

function cell(value, className) {
  return el("td", {className: className || ""}, value === null || value === undefined ? "—" : value);
}

function json(value) {
  const text = JSON.stringify(value);
  return text.length > 120 ? text.slice(0, 117) + "…" : text;
}

function fill(tbodyId, emptyId, rows, append) {
  const body = $(tbodyId);
  if (!append) body.replaceChildren();
  body.append(...rows);
  $(emptyId).hidden = body.children.length > 0;
}

function button(text, onClick, className) {
  const node = el("button", {type: "button", className: className || ""}, text);
  node.addEventListener("click", async () => {
    node.disabled = true;
    try {
      await onClick();
    } catch (error) {
      showError(error);
    } finally {
      node.disabled = false;
    }
  });
  return node;
}

function formValues(name) {
  const form = document.querySelector(`form[data-form="${name}"]`);
  return Object.fromEntries(new FormData(form).entries());
}

// -- pages ---------------------------------------------------------------------------------------

const cursors = {};

async function showLocks(more) {
  const {prefix} = formValues("locks");
  const page = await api("GET", "/api/v1/locks" + query({prefix, cursor: more ? cursors.locks : ""}));
  cursors.locks = page.cursor;
  const rows = page.items.map((lock) => el("tr", {},
    cell(lock.name, "name"), cell(lock.slot, "num"), cell(lock.owner, "name"), when(lock.since),
    when(lock.renewedAt), when(lock.expiresAt), cell(lock.token, "num"),
    el("td", {}, button("Release", () => release(lock), "danger"))));
  fill("locks-rows", "locks-empty", rows, more);
  $("locks-more").hidden = !page.cursor;
}

async function release(lock) {
  // By token alone, not as its owner: the operation an admin uses to free a stuck lock.
  const answer = await api("POST", "/api/v1/locks",
    {operations: [{op: "release", name: lock.name, slot: lock.slot, token: lock.token}]});
  const result = answer.results[0];
  if (result.released) notify(`Released ${lock.name} (slot ${lock.slot}, token ${lock.token}).`, "ok");
  else notify(`${lock.name} was not released: ${result.reason || "it is no longer held with that token"}.`, "error");
  await showLocks(false);
}

async function showKv(next) {
  const {ns, prefix, limit} = formValues("kv");
  if (!ns) {
    fill("kv-rows", "kv-empty", [], false);
    $("kv-empty").textContent = "Name a namespace.";
    return;
  }
  const page = await api("GET", "/api/v1/kv/" + encodeURIComponent(ns) +
    query({prefix, limit, cursor: next ? cursors.kv : ""}));
  $("kv-empty").textContent = "No keys.";
  cursors.kv = page.cursor;
  const rows = page.items.map((row) => el("tr", {},
    cell(row.key, "name"), cell(json(row.value), "value"), cell(row.version, "num"),
    row.expiresAt === null ? cell("never", "muted") : when(row.expiresAt)));
  fill("kv-rows", "kv-empty", rows, false);
  $("kv-next").hidden = !page.cursor;
  $("kv-first").hidden = !next;
}

async function showQueues(more) {
  const {prefix} = formValues("queues");
  const page = await api("GET", "/api/v1/resources/queues" + query({prefix, cursor: more ? cursors.queues : ""}));
  cursors.queues = page.cursor;
  const rows = page.items.map((queue) => el("tr", {},
    el("td", {className: "name"}, el("a", {href: "#/queues/" + encodeURIComponent(queue.queue)}, queue.queue)),
    cell(queue.partitions, "num"), cell(queue.messages, "num"), cell(queue.pending, "num"),
    cell(queue.inFlight, "num"),
    el("td", {className: "num"}, queue.dlq ? el("a", {href: "#/queues/" + encodeURIComponent(queue.queue)},
      String(queue.dlq)) : "0"),
    cell(queue.timers, "num"), age(queue.oldestPendingAt), cell(queue.groups.join(", ") || "—")));
  fill("queues-rows", "queues-empty", rows, more);
  $("queues-more").hidden = !page.cursor;
}

function fact(list, term, value) {
  list.append(el("dt", {}, term), el("dd", {}, value === null || value === undefined ? "—" : value));
}

function timeText(ms) {
  return ms === null || ms === undefined ? "—" : relative(ms) + " (" + utc(ms) + ")";
}

let currentQueue = null;

async function showQueue(name) {
  currentQueue = name;
  $("queue-title").textContent = "Queue " + name;
  const path = encodeURIComponent(name);
  const [info, partitions] = await Promise.all([
    api("GET", "/api/v1/resources/queues/" + path),
    api("GET", "/api/v1/resources/queues/" + path + "/partitions"),
  ]);
  const facts = $("queue-facts");
  facts.replaceChildren();
  if (!info.found) {
    fact(facts, "Status", "no such queue");
  } else {
    fact(facts, "Created", timeText(info.createdAt));
    fact(facts, "Messages", info.messages);
    fact(facts, "Bytes", info.bytes);
    fact(facts, "Partitions", info.partitions);
    fact(facts, "Timers", info.timers.pending + (info.timers.nextAt ? ", next " + timeText(info.timers.nextAt) : ""));
    fact(facts, "Lease time", info.options.leaseTimeSeconds + " s");
    fact(facts, "Retry limit", info.options.retryLimit);
  }
  fill("groups-rows", "groups-empty", (info.groups || []).map((group) => el("tr", {},
    cell(group.consumerGroup, "name"), cell(group.subscriptionMode), cell(group.pending, "num"),
    cell(group.inFlight, "num"), cell(group.leases, "num"), cell(group.dlq, "num"), age(group.oldestPendingAt))),
  false);
  const partitionRows = partitions.items.map((partition) => {
    const leased = partition.groups.filter((group) => group.lease).map((group) => group.consumerGroup);
    return el("tr", {}, cell(partition.partition, "name"), cell(partition.messages, "num"),
      cell(partition.firstOffset, "num"), cell(partition.nextOffset, "num"), cell(leased.join(", ") || "—"));
  });
  $("partitions-rows").replaceChildren(...partitionRows);
  await showDlq(false);
}

async function showDlq(more) {
  const name = currentQueue;
  const page = await api("GET", "/api/v1/dlq" + query({queue: name, cursor: more ? cursors.dlq : ""}));
  cursors.dlq = page.cursor;
  const rows = page.messages.map((entry) => el("tr", {},
    cell(entry.partition, "name"), cell(entry.offset, "num"), cell(entry.consumerGroup, "name"),
    cell(entry.retryCount, "num"), cell(entry.error), when(entry.dlqAt), cell(json(entry.data), "value"),
    el("td", {}, button("Requeue", () => requeue(name, entry)))));
  fill("dlq-rows", "dlq-empty", rows, more);
  $("dlq-more").hidden = !page.cursor;
  $("dlq-purge").hidden = page.total === 0;
}

async function requeue(queue, entry) {
  const answer = await api("POST", "/api/v1/dlq/requeue", {queue, consumerGroup: entry.consumerGroup,
    items: [{partitionId: entry.partitionId, offset: entry.offset}]});
  if (answer.results[0].requeued) notify(`Requeued ${queue} partition ${entry.partition} offset ${entry.offset}.`, "ok");
  else notify(`Not requeued: the entry at offset ${entry.offset} is no longer in the dead letter queue.`, "error");
  await showQueue(queue);
}

async function purge() {
  const queue = currentQueue;
  if (!window.confirm(`Delete every dead letter of ${queue}? They cannot be brought back.`)) return;
  const answer = await api("DELETE", "/api/v1/dlq" + query({queue}));
  notify(`Purged ${answer.purged} dead letters of ${queue}.`, "ok");
  await showQueue(queue);
}

async function showTimerQueues() {
  // The queues holding timers, each with its next due time (from the queue's own summary).
  const page = await api("GET", "/api/v1/resources/queues");
  const holding = page.items.filter((queue) => queue.timers > 0).slice(0, 50);
  const infos = await Promise.all(holding.map((queue) =>
    api("GET", "/api/v1/resources/queues/" + encodeURIComponent(queue.queue))));
  const rows = infos.map((info) => el("tr", {}, cell(info.queue, "name"), cell(info.timers.pending, "num"),
    when(info.timers.nextAt)));
  fill("timer-queues-rows", "timer-queues-empty", rows, false);
}

async function showTimers(more) {
  const {queue, prefix} = formValues("timers");
  if (!queue) return;
  const page = await api("GET", "/api/v1/timers" + query({queue, prefix, cursor: more ? cursors.timers : ""}));
  cursors.timers = page.cursor;
  const rows = page.items.map((timer) => el("tr", {},
    cell(timer.key, "name"), cell(timer.partition, "name"), when(timer.at), when(timer.scheduledAt),
    cell(timer.version, "num")));
  fill("timers-rows", "timers-empty", rows, more);
  $("timers-more").hidden = !page.cursor;
}

function duration(seconds) {
  const whole = Math.floor(seconds);
  const days = Math.floor(whole / 86400), hours = Math.floor(whole % 86400 / 3600);
  const minutes = Math.floor(whole % 3600 / 60), rest = whole % 60;
  if (days) return `${days} d ${hours} h ${minutes} min`;
  if (hours) return `${hours} h ${minutes} min`;
  if (minutes) return `${minutes} min ${rest} s`;
  return `${rest} s`;
}

function bytes(count) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = count, unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return (unit ? value.toFixed(1) : String(value)) + " " + units[unit];
}

async function showServer() {
  const info = await api("GET", "/api/v1/server");
  const facts = $("server-facts");
  facts.replaceChildren();
  fact(facts, "Version", info.version);
  fact(facts, "Uptime", duration(info.uptimeSeconds));
  fact(facts, "Started", utc(info.startedAt));
  const operator = info.log !== undefined;
  if (operator) {
    fact(facts, "Data directory", info.dataDir);
    fact(facts, "Log size", `${bytes(info.log.bytes)} on disk (${plural(info.log.segments, "segment")}, ` +
      `${plural(info.log.snapshots, "snapshot")})`);
    fact(facts, "Log state", info.log.failed ? "FAILED: writes are refused until a restart" : "ok");
    fact(facts, "Fsync latency", `last ${info.fsync.lastMs} ms, recent ${info.fsync.recentMs} ms, ` +
      `mean ${info.fsync.meanMs} ms over ${plural(info.fsync.frames, "frame")}`);
    fact(facts, "Connections", `${info.connections.open} open of ${info.connections.max}`);
    fact(facts, "Requests", info.requestsTotal);
  }
  $("server-operator-only").hidden = operator;
}

// -- routing ---------------------------------------------------------------------------------------

const PAGES = {locks: () => showLocks(false), kv: () => showKv(false), queues: () => showQueues(false),
  timers: async () => { await showTimerQueues(); await showTimers(false); }, server: showServer};

async function route() {
  const hash = location.hash.replace(/^#\/?/, "") || "locks";
  const [name, ...rest] = hash.split("/");
  for (const page of document.querySelectorAll(".page")) page.hidden = true;
  for (const tab of document.querySelectorAll("#tabs a")) {
    tab.classList.toggle("active", tab.dataset.page === name);
  }
  try {
    if (name === "queues" && rest.length) {
      $("page-queue").hidden = false;
      await showQueue(decodeURIComponent(rest.join("/")));
    } else if (PAGES[name]) {
      $("page-" + name).hidden = false;
      await PAGES[name]();
    } else {
      notify("No page " + name, "error");
    }
  } catch (error) {
    showError(error);
  }
}

// -- signing in ------------------------------------------------------------------------------------

function showSignIn() {
  $("sign-in").hidden = false;
  $("tabs").hidden = true;
  $("sign-out").hidden = true;
  $("who").textContent = "";
  for (const page of document.querySelectorAll(".page")) page.hidden = true;
  $("token").focus();
}

async function enter() {
  // Who the token is: also the check that it is valid (or that the server needs none).
  const me = await api("GET", "/api/v1/tenant");
  $("sign-in").hidden = true;
  $("tabs").hidden = false;
  $("sign-out").hidden = false;
  $("who").textContent = me.token === "-" ? "open server (no auth file)" :
    `${me.token} · ${me.role} · tenant ${me.tokenTenant}`;
  await route();
}

async function signIn(event) {
  event.preventDefault();
  clearNotice();
  sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
  $("token").value = "";
  try {
    await enter();
  } catch (error) {
    sessionStorage.removeItem(TOKEN_KEY);
    showError(error);
    showSignIn();
  }
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  clearNotice();
  showSignIn();
}

function start() {
  $("sign-in-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", signOut);
  for (const form of document.querySelectorAll("form[data-form]")) {
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      clearNotice();
      const show = {locks: showLocks, kv: showKv, queues: showQueues, timers: showTimers}[form.dataset.form];
      show(false).catch(showError);
    });
  }
  $("locks-more").addEventListener("click", () => showLocks(true).catch(showError));
  $("queues-more").addEventListener("click", () => showQueues(true).catch(showError));
  $("timers-more").addEventListener("click", () => showTimers(true).catch(showError));
  $("kv-next").addEventListener("click", () => showKv(true).catch(showError));
  $("kv-first").addEventListener("click", () => showKv(false).catch(showError));
  $("dlq-more").addEventListener("click", () => showDlq(true).catch(showError));
  $("dlq-purge").addEventListener("click", () => purge().catch(showError));
  window.addEventListener("hashchange", () => {
    clearNotice();
    if (!$("tabs").hidden) route();
  });
  // Signed in already in this tab, or a server that needs no token: straight in.
  enter().catch((error) => {
    if (!(error instanceof ApiError && error.status === 401)) showError(error);
    showSignIn();
  });
}

start();
