// The session page's timeline: the socket, scrolling through a long log with a bounded page, the model's
// text as it streams, permalinks, and the composer's keys. Every event node comes from the server's
// fragment endpoint (the same template the page itself renders); the socket only says that events exist.
import { activate, fetchEvents, fold, parseNodes, unfoldOrphans } from "./events.js";

const CHUNK = 100; // events per slice fetched while scrolling
const MAX_NODES = 600; // event nodes kept in the page; farther ones are dropped, and fetched again if needed
// While the view follows the live tail, fewer: a new event costs the page style, layout and paint that grow
// with the nodes it holds (Chromium's main thread here: 7 ms a new event with 70 nodes, 13 ms with 450).
// Scrolling up loads the earlier ones again. The oldest go a few at a time (FOLLOW_SLACK), not one per new
// event, as each drop moves everything that stays.
const FOLLOW_NODES = 60;
const FOLLOW_SLACK = 5;
const EDGE_PX = 800; // how close to an end of the loaded slice the next one is fetched
const STICK_PX = 48; // within this distance of the bottom, the view follows new events
const PANEL_TYPES = /^(session\.status_|session\.updated|brain\.|sandbox\.|fork\.)/;

// Setting textContent replaces the text even when it is the same, and the page then lays out and paints again.
function setIfChanged(node, property, value) {
  if (node[property] !== value) node[property] = value;
}

class Timeline {
  constructor(view) {
    this.view = view;
    this.scroller = view.querySelector(".timeline-scroll");
    this.list = view.querySelector("#timeline");
    this.previewList = view.querySelector("#previews");
    this.edge = view.querySelector("[data-edge=top]");
    this.empty = view.querySelector("[data-empty]");
    this.banner = view.querySelector("#live-banner");
    this.jump = document.getElementById("jump-latest");
    this.previewTemplate = document.getElementById("tpl-preview");
    this.url = view.dataset.eventsUrl;
    this.session = view.dataset.session;
    // The page holds events [lo, hi) of a log `length` long; while hi reaches the end, new ones append.
    this.lo = Number(view.dataset.start);
    this.hi = Number(view.dataset.stop);
    this.length = Number(view.dataset.length);
    this.tail = this.hi >= this.length; // the page follows the end of the log: new events append
    this.want = new Set();
    this.busy = false;
    this.stuck = true;
    this.unseen = 0;
    this.retries = 0;
    this.previews = new Map();
    this.arrived = new Map(); // seq -> node HTML the socket brought, until it goes into the page

    fold(this.list);
    if (!this.openPermalink()) this.scrollToBottom();
    this.scroller.addEventListener("scroll", () => this.onScroll(), { passive: true });
    window.addEventListener("hashchange", () => this.openPermalink());
    this.jump.addEventListener("click", () => this.toLatest());
    this.onScroll();
    this.connect();
  }

  // --- the socket

  connect() {
    clearTimeout(this.reconnectTimer);
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const socket = new WebSocket(`${scheme}//${location.host}/ws/ui/sessions/${this.session}/?after=${this.length - 1}`);
    let refusal = "";
    this.socket = socket;
    socket.onopen = () => {
      this.retries = 0;
      this.hideBanner();
    };
    socket.onmessage = (message) => {
      const data = JSON.parse(message.data);
      if (data.type === "event") this.onEvent(data);
      else if (data.type === "preview") this.onPreview(data.preview);
      else if (data.type === "error") refusal = data.message;
    };
    socket.onclose = (event) => {
      if (this.socket !== socket) return;
      if (event.code === 4401) {
        this.showBanner(`Live updates stopped: ${refusal}`, { action: "Log in again", onAction: () => location.reload() });
      } else if (event.code === 4404 || event.code === 4400) {
        this.showBanner(`Live updates stopped: ${refusal || "the server refused the connection"}`);
      } else {
        const delay = Math.min(15000, 500 * 2 ** this.retries++);
        this.showBanner(`Live updates disconnected; reconnecting in ${Math.ceil(delay / 1000)} s (from event #${this.length}).`,
                        { action: "Reconnect now", onAction: () => this.connect() });
        this.reconnectTimer = setTimeout(() => this.connect(), delay);
      }
    };
  }

  onEvent({ seq, event, html }) {
    if (seq < this.length) return;
    this.length = seq + 1;
    if (PANEL_TYPES.test(event?.type ?? "")) this.refreshPanel();
    if (!this.tail) {
      this.setUnseen(this.unseen + 1);
      return;
    }
    // The socket brings a live event's node: it goes in when the page reaches it, at once if nothing is
    // loading. Only what the socket did not bring (a catch-up run) is fetched as a slice. Nodes that come
    // while a slice is on its way wait for it rather than ask for another: on a busy server a page that
    // fetched for every event that came during a fetch never went back to taking them from the socket.
    if (html && this.arrived.size < MAX_NODES) this.arrived.set(seq, html);
    this.request("live");
  }

  // Put in the nodes the socket brought that follow on from the page; forget those the page has.
  takeArrived() {
    const run = [];
    while (this.arrived.has(this.hi + run.length)) run.push(this.arrived.get(this.hi + run.length));
    if (run.length) this.insert(parseNodes(run.join("")));
    for (const seq of this.arrived.keys()) if (seq < this.hi) this.arrived.delete(seq);
  }

  onPreview(preview) {
    if (!this.tail) return;
    const id = preview.type === "event_start" ? preview.event.id : preview.event_id;
    if (this.list.querySelector(`.ev[data-id="${CSS.escape(id)}"]`)) return;
    let node = this.previews.get(id);
    if (!node) {
      node = this.previewTemplate.content.firstElementChild.cloneNode(true);
      node.dataset.id = id;
      this.previews.set(id, node);
      this.previewList.append(node);
    }
    if (preview.type === "event_delta") node.querySelector(".text").append(preview.delta.content.text);
    if (this.stuck) this.scrollToBottom();
  }

  refreshPanel() {
    clearTimeout(this.panelTimer);
    this.panelTimer = setTimeout(() => window.htmx?.trigger(document.body, "wb:refresh"), 200);
  }

  // --- loading slices, one at a time, in the order the page needs them

  request(kind, target) {
    if (kind === "seek") this.seekTarget = target;
    this.want.add(kind);
    this.pump();
  }

  async pump() {
    if (this.busy) return;
    this.busy = true;
    try {
      while (this.want.size) {
        if (this.take("seek")) await this.reset(this.seekTarget);
        else if (this.take("live")) await this.loadLive();
        else if (this.take("up")) { if (this.lo > 0) await this.prepend(Math.max(0, this.lo - CHUNK), this.lo); }
        else if (this.take("down")) { if (!this.tail) await this.append(this.hi, this.hi + CHUNK); }
        this.checkEdges();
      }
    } catch (error) {
      this.showBanner(`Could not load events: ${error.message}`, { action: "Retry", onAction: () => this.request("live") });
    } finally {
      this.busy = false;
    }
  }

  take(kind) {
    return this.want.delete(kind);
  }

  async loadLive() {
    if (!this.tail) return;
    this.takeArrived();
    if (this.hi >= this.length) return;
    if (this.length - this.hi > MAX_NODES) return this.reset(null);
    await this.append(this.hi, Math.min(this.length, this.hi + 500), { live: true });
    if (this.hi < this.length) this.want.add("live");
  }

  async append(start, stop, { live = false } = {}) {
    const slice = await fetchEvents(this.url, start, stop);
    this.length = Math.max(this.length, slice.length);
    this.insert(slice.nodes, { live });
  }

  insert(fetched, { live = true } = {}) {
    const nodes = fetched.filter((node) => Number(node.dataset.seq) >= this.hi);
    if (!nodes.length) return;
    const stick = this.stuck;
    this.list.append(...nodes);
    this.hi = Number(nodes.at(-1).dataset.seq) + 1;
    if (this.hi >= this.length) this.tail = true;
    this.settle(nodes);
    const following = stick && this.tail;
    const excess = this.list.childElementCount - (following ? FOLLOW_NODES : MAX_NODES);
    if (excess > (following ? FOLLOW_SLACK : 0)) this.drop("top", excess);
    if (following) this.scrollToBottom();
    else if (live) this.setUnseen(this.unseen + nodes.length);
  }

  async prepend(start, stop) {
    const slice = await fetchEvents(this.url, start, stop);
    const nodes = slice.nodes.filter((node) => Number(node.dataset.seq) < this.lo);
    if (!nodes.length) return;
    const { scrollTop, scrollHeight } = this.scroller;
    this.list.prepend(...nodes);
    this.scroller.scrollTop = scrollTop + (this.scroller.scrollHeight - scrollHeight);
    this.lo = Number(nodes[0].dataset.seq);
    this.settle(nodes);
    const excess = this.list.childElementCount - MAX_NODES;
    if (excess > 0) this.drop("bottom", excess);
  }

  // Replace what the page holds by the slice around `center` (or the tail, for null).
  async reset(center) {
    const start = center === null ? Math.max(0, this.length - CHUNK) : Math.max(0, center - CHUNK / 2);
    const slice = await fetchEvents(this.url, start, start + CHUNK);
    this.length = Math.max(this.length, slice.length);
    this.list.replaceChildren(...slice.nodes);
    this.lo = slice.start;
    this.hi = slice.stop;
    // Jumping to the latest follows the log again, even if it grew while the slice was on its way.
    this.tail = center === null || this.hi >= this.length;
    this.clearPreviews();
    this.settle(slice.nodes);
    this.setUnseen(0);
    if (center === null) this.scrollToBottom();
    else this.reveal(center);
    if (this.tail && this.hi < this.length) this.want.add("live");
  }

  drop(end, count) {
    const doomed = end === "top" ? [...this.list.children].slice(0, count) : [...this.list.children].slice(-count);
    const { scrollTop, scrollHeight } = this.scroller;
    for (const node of doomed) node.remove();
    if (end === "top") {
      this.scroller.scrollTop = scrollTop - (scrollHeight - this.scroller.scrollHeight);
      this.lo = Number(this.list.firstElementChild.dataset.seq);
    } else {
      this.hi = Number(this.list.lastElementChild.dataset.seq) + 1;
      this.tail = false;
      this.clearPreviews();
    }
    unfoldOrphans(this.list);
    this.updateEdge();
  }

  settle(nodes) {
    activate(nodes);
    fold(this.list);
    if (nodes.some((node) => node.dataset.type === "span.model_request_end")) this.clearPreviews();
    for (const node of nodes) this.previews.get(node.dataset.id)?.remove();
    this.empty.hidden = this.list.childElementCount > 0;
    this.updateEdge();
  }

  clearPreviews() {
    this.previewList.replaceChildren();
    this.previews.clear();
  }

  // --- scrolling and permalinks

  onScroll() {
    if (this.scrollQueued) return;
    this.scrollQueued = true;
    requestAnimationFrame(() => {
      this.scrollQueued = false;
      const { scrollTop, scrollHeight, clientHeight } = this.scroller;
      this.stuck = scrollHeight - scrollTop - clientHeight < STICK_PX;
      if (this.stuck && this.tail) this.setUnseen(0);
      this.checkEdges();
    });
  }

  checkEdges() {
    const { scrollTop, scrollHeight, clientHeight } = this.scroller;
    if (scrollTop < EDGE_PX && this.lo > 0) this.request("up");
    if (scrollHeight - scrollTop - clientHeight < EDGE_PX && !this.tail) this.request("down");
  }

  scrollToBottom() {
    this.scroller.scrollTop = this.scroller.scrollHeight;
    this.stuck = true;
  }

  toLatest() {
    if (this.tail) {
      this.scrollToBottom();
      this.setUnseen(0);
    } else {
      this.request("seek", null);
    }
  }

  openPermalink() {
    const match = /^#seq-(\d+)$/.exec(location.hash);
    if (!match) return false;
    const seq = Number(match[1]);
    if (seq >= this.lo && seq < this.hi) this.reveal(seq);
    else if (seq < this.length) this.request("seek", seq);
    return true;
  }

  reveal(seq) {
    let node = document.getElementById(`seq-${seq}`);
    if (!node) return;
    if (node.classList.contains("folded")) node = document.getElementById(node.dataset.foldedInto) ?? node;
    this.list.querySelector(".highlight")?.classList.remove("highlight");
    node.classList.add("highlight");
    node.scrollIntoView({ block: "center" });
    this.stuck = false;
  }

  setUnseen(count) {
    this.unseen = count;
    const behind = !this.tail || (count > 0 && !this.stuck);
    setIfChanged(this.jump, "hidden", !behind);
    setIfChanged(this.jump, "textContent", count > 0 ? `${count} new event${count === 1 ? "" : "s"} ↓` : "Jump to the latest ↓");
  }

  updateEdge() {
    setIfChanged(this.edge, "textContent", this.lo > 0 ? `Events before #${this.lo} load as you scroll up` : "The start of the session");
  }

  // --- the live banner

  showBanner(text, { action, onAction } = {}) {
    this.banner.replaceChildren(text);
    if (action) {
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = action;
      button.addEventListener("click", onAction);
      this.banner.append(" ", button);
    }
    this.banner.hidden = false;
  }

  hideBanner() {
    this.banner.hidden = true;
  }
}

// The composer: Enter (or Ctrl+Enter) sends, Shift+Enter is a new line, Esc interrupts the brain.
function composerKeys() {
  document.addEventListener("keydown", (event) => {
    const field = event.target;
    if (event.key === "Enter" && field.matches?.("textarea[data-submit-on-enter]") && !event.isComposing) {
      const ctrl = event.ctrlKey || event.metaKey;
      if (event.shiftKey || (field.dataset.submitOnEnter === "ctrl" && !ctrl)) return;
      event.preventDefault();
      field.form.requestSubmit();
    } else if (event.key === "Escape" && !event.defaultPrevented) {
      document.getElementById("interrupt")?.requestSubmit();
    }
  });
  document.addEventListener("htmx:afterRequest", (event) => {
    const form = event.detail.elt;
    if (form.id === "composer" && event.detail.successful) {
      form.reset();
      form.querySelector("textarea").focus();
    }
  });
}

const view = document.getElementById("timeline-view");
if (view) {
  // Kept on window for debugging from the console.
  window.workbenchTimeline = new Timeline(view);
  composerKeys();
}
