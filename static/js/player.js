// The replay player: steps through a slice of the log, or plays it at a chosen speed, showing each event
// exactly as the live timeline does (the same server-rendered nodes, folded the same way).
import { activate, fetchEvents, fold, unfoldOrphans } from "./events.js";

const CHUNK = 200; // events fetched at a time, ahead of the cursor
const MAX_NODES = 600; // shown events kept in the page
const MAX_GAP_MS = 2000; // a long pause in the log plays as at most this long
const FIXED_MS = 100; // the delay of the "one event per 100 ms" speed

class Player {
  constructor(root) {
    this.url = root.dataset.eventsUrl;
    this.start = Number(root.dataset.start);
    this.stop = Number(root.dataset.stop);
    this.list = root.querySelector("#timeline");
    this.scroller = root.querySelector(".timeline-scroll");
    this.playButton = root.querySelector("[data-act=play]");
    this.speed = root.querySelector("[data-speed]");
    this.scrub = root.querySelector("[data-scrub]");
    this.position = root.querySelector("[data-position]");
    this.forkAt = root.querySelector("[data-fork-at]");
    this.hint = root.querySelector("[data-hint]");
    // Pristine nodes of the slice, index i holding seq start + i; the page shows clones of [start, cursor).
    this.pristine = [];
    this.cursor = this.start;
    this.playing = false;

    root.querySelector(".player-controls").addEventListener("click", (event) => {
      const act = event.target.closest("[data-act]")?.dataset.act;
      if (act) this.run(act);
    });
    this.scrub.addEventListener("change", () => this.guard(() => this.seek(Number(this.scrub.value))));
    document.addEventListener("keydown", (event) => this.onKey(event));
    this.update();
  }

  run(act) {
    if (act === "play") return this.playing ? this.pause() : this.play();
    this.pause();
    const target = { first: this.start, back: this.cursor - 1, step: this.cursor + 1, last: this.stop }[act];
    this.guard(() => this.seek(target));
  }

  onKey(event) {
    if (event.target.closest("input, select, textarea")) return;
    const act = { " ": "play", ArrowLeft: "back", ArrowRight: "step", Home: "first", End: "last" }[event.key];
    if (!act || (act === "play" && event.target.closest("button"))) return;
    event.preventDefault();
    this.run(act);
  }

  async guard(action) {
    try {
      await action();
    } catch (error) {
      this.pause();
      this.position.textContent = `Could not load events: ${error.message}`;
    }
  }

  // Fetch the pristine nodes up to `seq` (exclusive) if they are not here yet.
  async ensure(seq) {
    while (this.start + this.pristine.length < Math.min(seq, this.stop)) {
      const from = this.start + this.pristine.length;
      const slice = await fetchEvents(this.url, from, Math.min(this.stop, from + CHUNK));
      if (!slice.nodes.length) {
        this.stop = from;
        break;
      }
      this.pristine.push(...slice.nodes);
    }
  }

  async seek(target) {
    target = Math.max(this.start, Math.min(this.stop, target));
    await this.ensure(target);
    target = Math.min(target, this.stop);
    if (target < this.cursor) {
      if (this.cursor - target === 1) this.removeLast();
      else this.rebuild(target);
    } else if (target > this.cursor) {
      const first = Math.max(this.cursor, target - MAX_NODES);
      if (first > this.cursor) this.list.replaceChildren();
      const nodes = this.pristine.slice(first - this.start, target - this.start).map((node) => node.cloneNode(true));
      this.list.append(...nodes);
      activate(nodes);
      fold(this.list);
      this.cursor = target;
      this.trim();
    }
    this.scroller.scrollTop = this.scroller.scrollHeight;
    this.update();
  }

  rebuild(target) {
    this.list.replaceChildren();
    this.cursor = Math.max(this.start, target - MAX_NODES);
    const nodes = this.pristine.slice(this.cursor - this.start, target - this.start).map((node) => node.cloneNode(true));
    this.list.append(...nodes);
    activate(nodes);
    fold(this.list);
    this.cursor = target;
  }

  // Step back one event; a call it had answered goes back to waiting, as it looked at that moment.
  removeLast() {
    const node = this.list.lastElementChild;
    this.cursor -= 1;
    if (!node) return;
    node.remove();
    const callId = node.dataset.resultFor || node.dataset.answers;
    const call = callId && this.list.querySelector(`.ev[data-call="${CSS.escape(callId)}"]`);
    if (call) {
      const fresh = this.pristine[Number(call.dataset.seq) - this.start].cloneNode(true);
      call.replaceWith(fresh);
      activate([fresh]);
      for (const folded of this.list.querySelectorAll(`.ev.folded[data-folded-into="${CSS.escape(call.id)}"]`)) {
        folded.classList.remove("folded");
      }
      fold(this.list);
    }
  }

  trim() {
    const excess = this.list.childElementCount - MAX_NODES;
    for (let i = 0; i < excess; i++) this.list.firstElementChild.remove();
    if (excess > 0) unfoldOrphans(this.list);
  }

  play() {
    if (this.cursor >= this.stop) this.rebuild(this.start);
    this.playing = true;
    this.playButton.textContent = "⏸ Pause";
    this.tick();
  }

  pause() {
    this.playing = false;
    clearTimeout(this.timer);
    this.playButton.textContent = "▶ Play";
  }

  async tick() {
    if (!this.playing) return;
    if (this.cursor >= this.stop) return this.pause();
    await this.guard(() => this.seek(this.cursor + 1));
    if (!this.playing || this.cursor >= this.stop) return this.pause();
    await this.guard(() => this.ensure(this.cursor + 1));
    this.timer = setTimeout(() => this.tick(), this.delay());
  }

  // The wait before the next event: the log's own gap divided by the speed, or a fixed pace.
  delay() {
    const speed = Number(this.speed.value);
    if (!speed) return FIXED_MS;
    const previous = this.pristine[this.cursor - 1 - this.start];
    const next = this.pristine[this.cursor - this.start];
    if (!previous || !next) return FIXED_MS;
    const gap = Number(next.dataset.at) - Number(previous.dataset.at);
    return Math.min(MAX_GAP_MS, Math.max(0, gap) / speed);
  }

  update() {
    const shown = this.cursor - this.start;
    this.scrub.value = this.cursor;
    this.position.textContent = `${shown} of ${this.stop - this.start} shown · next #${this.cursor}`;
    if (this.forkAt) this.forkAt.value = this.cursor;
    this.hint.hidden = this.list.childElementCount > 0;
  }
}

const root = document.getElementById("player");
if (root?.querySelector(".player-controls")) window.workbenchPlayer = new Player(root);
