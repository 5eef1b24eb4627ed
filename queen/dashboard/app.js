// Queen's dashboard: one page, hash routes, the JSON API with the signed-in token.
// A live monitor: the page in view and the node's status refresh every REFRESH_MS without a
// reload, one refresh at a time, and the status bar says when what is shown is stale.
// Every text the server sends is set with textContent: names are chosen by users.
"use strict";

const TOKEN_KEY = "queen.token";
const TENANT_KEY = "queen.tenant"; // the tenant the operator reads as; absent: its own names
// Often enough to watch a queue fill and drain, rare enough that an open dashboard costs the
// server two or three small reads every few seconds (the page in view and the node's status).
const REFRESH_MS = 3000;
// A call not answered in this long is given up, so a hung server cannot stop the refreshes.
const REQUEST_TIMEOUT_MS = 10000;
// No fresh data for this long (a slow server, a tab the browser throttled) is called stale.
const STALE_MS = 3 * REFRESH_MS;
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
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), REQUEST_TIMEOUT_MS);
  try {
    let response;
    try {
      response = await fetch(path, {method, headers, signal: abort.signal,
        body: body === undefined ? undefined : JSON.stringify(body)});
    } catch (error) {
      throw new ApiError(0, abort.signal.aborted ? `no answer within ${REQUEST_TIMEOUT_MS / 1000} s` :
        "the server did not answer: " + error.message);
    }
    let document = null;
    try {
      document = await response.json();
    } catch (error) {
      document = null;
    }
    if (!response.ok) {
      throw new ApiError(response.status, errorMessage(document) || response.statusText);
    }
    return document;
  } finally {
    clearTimeout(timer);
  }
}

// A refusal is {"error": "<message>", "code", "details", "detail"}: its sentence.
function errorMessage(document) {
  return document && typeof document.error === "string" ? document.error : "";
}

// The tenant the operator reads as ("" for its own names, the default tenant's).
function viewTenant() {
  return sessionStorage.getItem(TENANT_KEY) || "";
}

// A call on the data of the tenant in view: with ?tenant= when the operator picked one. The
// server takes it on reads only, so a write in that view is refused rather than sent elsewhere.
function data(method, path, body) {
  const tenant = viewTenant();
  if (tenant) path += (path.includes("?") ? "&" : "?") + "tenant=" + encodeURIComponent(tenant);
  return api(method, path, body);
}

// Actions (release, requeue, purge) are offered only on the token's own names.
function readOnly() {
  return viewTenant() !== "";
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

function describe(error) {
  if (!(error instanceof ApiError)) return "Error: " + error.message;
  const label = LABELS[error.status] || (error.status ? "Error " + error.status : "Error");
  return label + ": " + error.message;
}

function showError(error) {
  notify(describe(error), "error");
  if (error instanceof ApiError && error.status === 401) showSignIn();
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

function clock(ms) {
  return new Date(ms).toISOString().slice(11, 19) + " UTC";
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

function cell(value, className, field) {
  const node = el("td", {className: className || ""}, value === null || value === undefined ? "—" : value);
  if (field) node.dataset.field = field;
  return node;
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

// An action's cell: its button, or nothing in a tenant's read-only view.
function action(text, onClick, className) {
  return el("td", {}, readOnly() ? null : button(text, onClick, className));
}

function formValues(name) {
  const form = document.querySelector(`form[data-form="${name}"]`);
  return Object.fromEntries(new FormData(form).entries());
}

function fact(list, term, value, field) {
  const dd = el("dd", {}, value === null || value === undefined ? "—" : value);
  if (field) dd.dataset.field = field;
  list.append(el("dt", {}, term), dd);
  return dd;
}

// -- rates -------------------------------------------------------------------------------------------

// Per second, from a counter's last two readings (the server keeps counters since its start). A
// counter that went down was reset (a restart, a new leader, a queue deleted and made again).
const samples = new Map(); // key -> {value, at, rate}

function rate(key, value, at) {
  if (typeof value !== "number") return null;
  const last = samples.get(key);
  if (!last || value < last.value) {
    samples.set(key, {value, at, rate: null});
    return null;
  }
  // Readings close together (a click right after a refresh) say little: keep the last rate.
  if (at - last.at < 1000) return last.rate;
  const perSecond = (value - last.value) * 1000 / (at - last.at);
  samples.set(key, {value, at, rate: perSecond});
  return perSecond;
}

function perSecond(value) {
  if (value === null || value === undefined) return "—";
  if (value === 0) return "0";
  if (value < 0.1) return value.toFixed(2);
  if (value < 10) return value.toFixed(1);
  return String(Math.round(value));
}

// The queue's four rates, keyed by the tenant in view and the queue's name.
function queueRates(tenant, name, totals, at) {
  const out = {};
  for (const what of ["pushed", "popped", "acked", "failed"]) {
    out[what] = totals ? rate(`queue ${tenant} ${name} ${what}`, totals[what], at) : null;
  }
  return out;
}

// -- pages -------------------------------------------------------------------------------------------
//
// Each page's load(more) reads what it shows and returns a render function: the reads of a
// refresh and of a click may overlap, and only the newest page's render is applied.

const cursors = {};
const applied = {}; // each form's values as last submitted: what its page's refreshes read

function filter(name) {
  if (!applied[name]) applied[name] = formValues(name);
  return applied[name];
}

async function loadLocks(more) {
  const {prefix} = filter("locks");
  const page = await data("GET", "/api/v1/locks" + query({prefix, cursor: more ? cursors.locks : ""}));
  return () => {
    cursors.locks = page.cursor;
    const rows = page.items.map((lock) => el("tr", {},
      cell(lock.name, "name"), cell(lock.slot, "num"), cell(lock.owner, "name"), when(lock.since),
      when(lock.renewedAt), when(lock.expiresAt), cell(lock.token, "num"),
      action("Release", () => release(lock), "danger")));
    fill("locks-rows", "locks-empty", rows, more);
    $("locks-more").hidden = !page.cursor;
  };
}

async function release(lock) {
  // By token alone, not as its owner: the operation an admin uses to free a stuck lock.
  const answer = await data("POST", "/api/v1/locks",
    {operations: [{op: "release", name: lock.name, slot: lock.slot, token: lock.token}]});
  const result = answer.results[0];
  if (result.released) notify(`Released ${lock.name} (slot ${lock.slot}, token ${lock.token}).`, "ok");
  else notify(`${lock.name} was not released: ${result.reason || "it is no longer held with that token"}.`, "error");
  await show(() => loadLocks(false));
}

async function loadKv(next) {
  const {ns, prefix, limit} = filter("kv");
  if (!ns) {
    return () => {
      fill("kv-rows", "kv-empty", [], false);
      $("kv-empty").textContent = "Name a namespace.";
    };
  }
  const page = await data("GET", "/api/v1/kv/" + encodeURIComponent(ns) +
    query({prefix, limit, cursor: next ? cursors.kv : ""}));
  return () => {
    $("kv-empty").textContent = "No keys.";
    cursors.kv = page.cursor;
    const rows = page.items.map((row) => el("tr", {},
      cell(row.key, "name"), cell(json(row.value), "value"), cell(row.version, "num"),
      row.expiresAt === null ? cell("never", "muted") : when(row.expiresAt)));
    fill("kv-rows", "kv-empty", rows, false);
    $("kv-next").hidden = !page.cursor;
    $("kv-first").hidden = !next;
  };
}

async function loadQueues(more) {
  const {prefix} = filter("queues");
  const tenant = viewTenant();
  const page = await data("GET", "/api/v1/resources/queues" + query({prefix, cursor: more ? cursors.queues : ""}));
  const at = performance.now();
  return () => {
    cursors.queues = page.cursor;
    const rows = page.items.map((queue) => {
      const rates = queueRates(tenant, queue.queue, queue.totals, at);
      const link = "#/queues/" + encodeURIComponent(queue.queue);
      const row = el("tr", {},
        el("td", {className: "name"}, el("a", {href: link}, queue.queue)),
        cell(queue.partitions, "num"), cell(queue.messages, "num", "depth"), cell(queue.pending, "num", "pending"),
        cell(queue.inFlight, "num", "inFlight"),
        el("td", {className: "num"}, queue.dlq ? el("a", {href: link}, String(queue.dlq)) : "0"),
        cell(queue.consumers, "num", "consumers"), cell(perSecond(rates.pushed), "num", "pushRate"),
        cell(perSecond(rates.popped), "num", "popRate"), cell(perSecond(rates.acked), "num", "ackRate"),
        cell(perSecond(rates.failed), "num", "failRate"), cell(queue.timers, "num"), age(queue.oldestPendingAt),
        cell(queue.groups.join(", ") || "—"));
      row.dataset.queue = queue.queue;
      return row;
    });
    fill("queues-rows", "queues-empty", rows, more);
    $("queues-more").hidden = !page.cursor;
  };
}

function timeText(ms) {
  return ms === null || ms === undefined ? "—" : relative(ms) + " (" + utc(ms) + ")";
}

async function loadQueue(name) {
  const path = encodeURIComponent(name);
  const tenant = viewTenant();
  const [info, partitions, dlq] = await Promise.all([
    data("GET", "/api/v1/resources/queues/" + path),
    data("GET", "/api/v1/resources/queues/" + path + "/partitions"),
    loadDlq(name, false),
  ]);
  const at = performance.now();
  return () => {
    currentQueue = name;
    $("queue-title").textContent = "Queue " + name;
    const facts = $("queue-facts");
    facts.replaceChildren();
    if (!info.found) {
      fact(facts, "Status", "no such queue");
    } else {
      const rates = queueRates(tenant, name, info.totals, at);
      fact(facts, "Created", timeText(info.createdAt));
      fact(facts, "Messages", info.messages, "depth");
      fact(facts, "Bytes", info.bytes);
      fact(facts, "Partitions", info.partitions);
      fact(facts, "Timers", info.timers.pending + (info.timers.nextAt ? ", next " + timeText(info.timers.nextAt) : ""));
      fact(facts, "Lease time", info.options.leaseTimeSeconds + " s");
      fact(facts, "Retry limit", info.options.retryLimit);
      fact(facts, "Push/s", perSecond(rates.pushed), "pushRate");
      fact(facts, "Pop/s", perSecond(rates.popped), "popRate");
      fact(facts, "Ack/s", perSecond(rates.acked), "ackRate");
      fact(facts, "Failed/s", perSecond(rates.failed), "failRate");
    }
    fill("groups-rows", "groups-empty", (info.groups || []).map((group) => {
      const row = el("tr", {},
        cell(group.consumerGroup, "name"), cell(group.subscriptionMode), cell(group.pending, "num", "pending"),
        cell(group.inFlight, "num", "inFlight"), cell(group.consumers, "num", "consumers"),
        cell(group.leases, "num", "leases"), cell(group.parkedPops, "num", "parkedPops"), cell(group.dlq, "num"),
        age(group.oldestPendingAt));
      row.dataset.group = group.consumerGroup;
      return row;
    }), false);
    const partitionRows = partitions.items.map((partition) => {
      const leased = partition.groups.filter((group) => group.lease).map((group) => group.consumerGroup);
      return el("tr", {}, cell(partition.partition, "name"), cell(partition.messages, "num"),
        cell(partition.firstOffset, "num"), cell(partition.nextOffset, "num"), cell(leased.join(", ") || "—"));
    });
    $("partitions-rows").replaceChildren(...partitionRows);
    dlq();
  };
}

let currentQueue = null;

async function loadDlq(name, more) {
  const page = await data("GET", "/api/v1/dlq" + query({queue: name, cursor: more ? cursors.dlq : ""}));
  return () => {
    cursors.dlq = page.cursor;
    const rows = page.messages.map((entry) => el("tr", {},
      cell(entry.partition, "name"), cell(entry.offset, "num"), cell(entry.consumerGroup, "name"),
      cell(entry.retryCount, "num"), cell(entry.error), when(entry.dlqAt), cell(json(entry.data), "value"),
      action("Requeue", () => requeue(name, entry))));
    fill("dlq-rows", "dlq-empty", rows, more);
    $("dlq-more").hidden = !page.cursor;
    $("dlq-purge").hidden = page.total === 0 || readOnly();
  };
}

async function requeue(queue, entry) {
  const answer = await data("POST", "/api/v1/dlq/requeue", {queue, consumerGroup: entry.consumerGroup,
    items: [{partitionId: entry.partitionId, offset: entry.offset}]});
  if (answer.results[0].requeued) notify(`Requeued ${queue} partition ${entry.partition} offset ${entry.offset}.`, "ok");
  else notify(`Not requeued: the entry at offset ${entry.offset} is no longer in the dead letter queue.`, "error");
  await show(() => loadQueue(queue));
}

async function purge() {
  const queue = currentQueue;
  if (!window.confirm(`Delete every dead letter of ${queue}? They cannot be brought back.`)) return;
  const answer = await data("DELETE", "/api/v1/dlq" + query({queue}));
  notify(`Purged ${answer.purged} dead letters of ${queue}.`, "ok");
  await show(() => loadQueue(queue));
}

async function loadTimerQueues() {
  // The queues holding timers, each with its next due time (from the queue's own summary).
  const page = await data("GET", "/api/v1/resources/queues");
  const holding = page.items.filter((queue) => queue.timers > 0).slice(0, 50);
  const infos = await Promise.all(holding.map((queue) =>
    data("GET", "/api/v1/resources/queues/" + encodeURIComponent(queue.queue))));
  return () => {
    const rows = infos.map((info) => el("tr", {}, cell(info.queue, "name"), cell(info.timers.pending, "num"),
      when(info.timers.nextAt)));
    fill("timer-queues-rows", "timer-queues-empty", rows, false);
  };
}

async function loadTimers(more) {
  const {queue, prefix} = filter("timers");
  if (!queue) return () => {};
  const page = await data("GET", "/api/v1/timers" + query({queue, prefix, cursor: more ? cursors.timers : ""}));
  return () => {
    cursors.timers = page.cursor;
    const rows = page.items.map((timer) => el("tr", {},
      cell(timer.key, "name"), cell(timer.partition, "name"), when(timer.at), when(timer.scheduledAt),
      cell(timer.version, "num")));
    fill("timers-rows", "timers-empty", rows, more);
    $("timers-more").hidden = !page.cursor;
  };
}

async function loadTimersPage() {
  const [queues, timers] = await Promise.all([loadTimerQueues(), loadTimers(false)]);
  return () => {
    queues();
    timers();
  };
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

async function loadServer() {
  // The whole server's, whatever tenant the operator reads as: no ?tenant=. The node's facts come
  // with the status bar's (renderNode).
  const info = await api("GET", "/api/v1/server");
  const at = performance.now();
  return () => {
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
      const rates = $("rate-facts");
      rates.replaceChildren();
      fact(rates, "Requests/s", perSecond(rate("server requests", info.requestsTotal, at)), "requestRate");
      fact(rates, "Client errors (4xx)/s", perSecond(rate("server 4xx", info.clientErrorsTotal, at)),
        "clientErrorRate");
      fact(rates, "Server errors (5xx)/s", perSecond(rate("server 5xx", info.serverErrorsTotal, at)),
        "serverErrorRate");
    }
    $("server-rates").hidden = !operator;
    $("server-operator-only").hidden = operator;
  };
}

function yesNo(value) {
  return value === undefined || value === null ? "—" : value ? "yes" : "no";
}

function renderNodeFacts(cluster) {
  const facts = $("node-facts");
  facts.replaceChildren();
  fact(facts, "Role", cluster.role, "role");
  fact(facts, "Epoch", cluster.epoch, "epoch");
  fact(facts, "Serving", yesNo(cluster.serving), "serving");
  fact(facts, "Degraded", yesNo(cluster.degraded), "degraded");
  if ("syncUnavailable" in cluster) fact(facts, "Sync unavailable", yesNo(cluster.syncUnavailable), "syncUnavailable");
  if (cluster.cluster) {
    fact(facts, "Cluster", `${cluster.cluster}, node ${cluster.node}`);
    fact(facts, "Leader", cluster.leader ? `${cluster.leader.node} (${cluster.leader.advertise})` : "none");
    fact(facts, "Sync set", cluster.sync.length ? cluster.sync.join(", ") : "none");
    fact(facts, "Followers", cluster.followers.length ? cluster.followers.map((follower) =>
      `${follower.node}: ${follower.connected ? "connected" : "not connected"}, ${follower.lagVersions} behind`)
      .join("; ") : "none");
  }
  fact(facts, "Last version", cluster.lastVersion);
}

// -- the node's status: the status bar and the warning banner ----------------------------------------

async function loadNode() {
  const cluster = await api("GET", "/api/v1/cluster");
  return () => renderNode(cluster);
}

function renderNode(cluster) {
  $("node").textContent = `${cluster.role} · epoch ${cluster.epoch}`;
  const warnings = [];
  if (cluster.syncUnavailable) {
    warnings.push("Sync set unavailable: this leader cannot reach its sync set (" +
      (cluster.sync.join(", ") || "none") + "), so writes are refused until a member is back.");
  }
  if (cluster.degraded) {
    warnings.push("Degraded: the sync set is not full (" + (cluster.sync.join(", ") || "no member") +
      "); acknowledged writes are on fewer nodes than the cluster should keep them on.");
  }
  if (cluster.serving === false) {
    const leader = cluster.leader ? ` The leader is ${cluster.leader.node} at ${cluster.leader.advertise}:` +
      " open the dashboard there." : " There is no leader right now.";
    warnings.push(`This node is ${cluster.role} and does not serve data.` + leader);
  }
  const banner = $("cluster-banner");
  banner.replaceChildren(...warnings.map((text) => el("p", {}, text)));
  banner.hidden = warnings.length === 0;
  renderNodeFacts(cluster);
}

// -- live refresh --------------------------------------------------------------------------------------

const live = {
  generation: 0, // bumped by every navigation: a load started before it renders nothing
  load: null, // () => the page in view's load, for the refreshes
  paged: false, // the user asked for more than the first page: refreshes leave the list alone
  timer: 0,
  refreshing: false,
  okAt: 0, // when the last read succeeded (Date.now())
  failure: null, // the last refresh's error, until one succeeds
};

function signedIn() {
  return !$("tabs").hidden;
}

function schedule() {
  clearTimeout(live.timer);
  if (signedIn()) live.timer = setTimeout(refresh, REFRESH_MS);
}

// One at a time: the next is scheduled when this one has ended, so a slow server never has
// refreshes piling up on it. A tab in the background does not refresh at all.
async function refresh() {
  if (live.refreshing || !signedIn()) return;
  if (document.hidden) {
    schedule();
    return;
  }
  live.refreshing = true;
  const generation = live.generation;
  try {
    // The node's status is shown even when the page's reads fail, and the other way round.
    const [node, page] = await Promise.allSettled([loadNode(),
      live.load && !live.paged ? live.load() : Promise.resolve(null)]);
    if (node.status === "fulfilled") node.value();
    if (page.status === "fulfilled" && page.value && generation === live.generation) page.value();
    const failure = [node, page].find((outcome) => outcome.status === "rejected");
    if (failure) failed(failure.reason);
    else fresh();
  } finally {
    live.refreshing = false;
    schedule();
  }
}

function fresh() {
  live.okAt = Date.now();
  live.failure = null;
  showLive();
}

function failed(error) {
  if (error instanceof ApiError && error.status === 401) {
    showError(error);
    return;
  }
  live.failure = error;
  showLive();
}

function showLive() {
  const status = $("live");
  const since = live.okAt ? `showing data from ${clock(live.okAt)} (${relative(live.okAt)})` : "nothing shown yet";
  let text, stale = true;
  status.title = live.failure ? describe(live.failure) : "";
  if (live.failure instanceof ApiError && live.failure.status === 0) {
    text = `Server unreachable; ${since}. Trying again every ${REFRESH_MS / 1000} s.`;
  } else if (live.failure) {
    text = `Refresh failed (${describe(live.failure)}); ${since}.`;
  } else if (!live.okAt) {
    stale = false;
    text = "Loading…";
  } else if (Date.now() - live.okAt > STALE_MS) {
    text = `Stale: no fresh data since ${clock(live.okAt)} (${relative(live.okAt)}).`;
  } else {
    stale = false;
    text = live.paged ? `Updated ${clock(live.okAt)}; the list is not refreshed while you page through it.` :
      `Live: updated ${clock(live.okAt)}, every ${REFRESH_MS / 1000} s.`;
  }
  status.textContent = text;
  status.classList.toggle("stale", stale);
}

setInterval(() => {
  for (const node of document.querySelectorAll(".rel[data-at]")) {
    node.textContent = relative(Number(node.dataset.at));
  }
  if (signedIn()) showLive();
}, 1000);

// A user's action: load and render now (the newest navigation wins), and let the refreshes go on
// with it. paging: it shows more than the first page, which the refreshes then leave alone.
async function show(load, paging) {
  live.generation += 1;
  const generation = live.generation;
  if (paging) live.paged = true;
  else {
    live.load = load;
    live.paged = false;
  }
  try {
    const render = await load();
    if (generation === live.generation) {
      render();
      fresh();
    }
  } finally {
    schedule();
  }
}

// -- routing ---------------------------------------------------------------------------------------

const PAGES = {locks: () => loadLocks(false), kv: () => loadKv(false), queues: () => loadQueues(false),
  timers: loadTimersPage, server: loadServer};

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
      const queue = decodeURIComponent(rest.join("/"));
      await show(() => loadQueue(queue));
    } else if (PAGES[name]) {
      $("page-" + name).hidden = false;
      await show(PAGES[name]);
    } else {
      live.load = null;
      notify("No page " + name, "error");
    }
  } catch (error) {
    showError(error);
  }
}

// -- signing in, and the operator's tenant -----------------------------------------------------------

function showSignIn() {
  clearTimeout(live.timer);
  $("sign-in").hidden = false;
  $("tabs").hidden = true;
  $("sign-out").hidden = true;
  $("status-bar").hidden = true;
  $("cluster-banner").hidden = true;
  $("tenant-picker").hidden = true;
  $("who").textContent = "";
  for (const page of document.querySelectorAll(".page")) page.hidden = true;
  $("token").focus();
}

// The operator (an admin of tenant *, or anyone on a server without an auth file) may read any
// tenant's data: it picks one from GET /api/v1/tenants; "default" is its own names.
async function offerTenants(me) {
  const operator = me.token === "-" || (me.role === "admin" && me.tokenTenant === "*");
  $("tenant-picker").hidden = true;
  if (!operator) {
    sessionStorage.removeItem(TENANT_KEY);
    return;
  }
  const known = (await api("GET", "/api/v1/tenants")).items.map((item) => item.tenant)
    .filter((tenant) => tenant !== "default");
  if (!known.includes(viewTenant())) sessionStorage.removeItem(TENANT_KEY);
  const select = $("tenant-select");
  select.replaceChildren(el("option", {value: ""}, "default"),
    ...known.map((tenant) => el("option", {value: tenant}, tenant)));
  select.value = viewTenant();
  $("tenant-picker").hidden = known.length === 0;
}

function showViewing() {
  const tenant = viewTenant();
  $("viewing").textContent = tenant ? `Reading tenant ${tenant} as the operator: read-only` : "";
  $("viewing").hidden = !tenant;
}

function pickTenant() {
  const tenant = $("tenant-select").value;
  if (tenant) sessionStorage.setItem(TENANT_KEY, tenant);
  else sessionStorage.removeItem(TENANT_KEY);
  for (const name of Object.keys(cursors)) delete cursors[name];
  clearNotice();
  showViewing();
  route();
}

async function enter() {
  // Who the token is: also the check that it is valid (or that the server needs none).
  const me = await api("GET", "/api/v1/tenant");
  await offerTenants(me);
  const node = await loadNode();
  $("sign-in").hidden = true;
  $("tabs").hidden = false;
  $("sign-out").hidden = false;
  $("status-bar").hidden = false;
  $("who").textContent = me.token === "-" ? "open server (no auth file)" :
    `${me.token} · ${me.role} · tenant ${me.tokenTenant}`;
  node();
  showViewing();
  await route();
}

async function signIn(event) {
  event.preventDefault();
  clearNotice();
  sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
  sessionStorage.removeItem(TENANT_KEY);
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
  sessionStorage.removeItem(TENANT_KEY);
  clearNotice();
  // What this token was shown goes with it, hidden or not.
  for (const shown of document.querySelectorAll("main tbody, main dl")) shown.replaceChildren();
  live.load = null;
  showSignIn();
}

function start() {
  $("sign-in-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", signOut);
  $("tenant-select").addEventListener("change", pickTenant);
  const loaders = {locks: loadLocks, kv: loadKv, queues: loadQueues, timers: loadTimers};
  for (const form of document.querySelectorAll("form[data-form]")) {
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      clearNotice();
      const name = form.dataset.form;
      applied[name] = formValues(name);
      const load = name === "timers" ? loadTimersPage : () => loaders[name](false);
      show(load).catch(showError);
    });
  }
  $("locks-more").addEventListener("click", () => show(() => loadLocks(true), true).catch(showError));
  $("queues-more").addEventListener("click", () => show(() => loadQueues(true), true).catch(showError));
  $("timers-more").addEventListener("click", () => show(() => loadTimers(true), true).catch(showError));
  $("kv-next").addEventListener("click", () => show(() => loadKv(true), true).catch(showError));
  $("kv-first").addEventListener("click", () => show(() => loadKv(false)).catch(showError));
  $("dlq-more").addEventListener("click", () => show(() => loadDlq(currentQueue, true), true).catch(showError));
  $("dlq-purge").addEventListener("click", () => purge().catch(showError));
  window.addEventListener("hashchange", () => {
    clearNotice();
    if (signedIn()) route();
  });
  // Back in view: refresh now rather than at the next tick.
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && signedIn()) refresh();
  });
  // Signed in already in this tab, or a server that needs no token: straight in.
  enter().catch((error) => {
    if (!(error instanceof ApiError && error.status === 401)) showError(error);
    showSignIn();
  });
}

start();
