// What the live timeline and the replay player both do with the event nodes the server renders.

export const FRAGMENT_HEADERS = { "X-Workbench-Fragment": "1" };

// Events [start:stop) from the fragment endpoint: the nodes, and the slice and log length the server resolved.
export async function fetchEvents(url, start, stop) {
  const response = await fetch(`${url}?start=${start}&stop=${stop}`, { headers: FRAGMENT_HEADERS });
  if (!response.ok) {
    const reason = response.status === 401 ? "your login has expired; reload the page" : await response.text();
    throw new Error(`${reason || "HTTP " + response.status}`);
  }
  return {
    nodes: parseNodes(await response.text()),
    start: Number(response.headers.get("X-Slice-Start")),
    stop: Number(response.headers.get("X-Slice-Stop")),
    length: Number(response.headers.get("X-Session-Length")),
  };
}

// Event nodes from the server's HTML (the fragment endpoint's answer, or a live event's node from the socket).
export function parseNodes(html) {
  const template = document.createElement("template");
  template.innerHTML = html;
  return [...template.content.children];
}

// htmx wires the forms inside call cards (allow, deny, custom results).
export function activate(nodes) {
  for (const node of nodes) window.htmx?.process(node);
}

const callOf = (list, id) => list.querySelector(`.ev[data-call="${CSS.escape(id)}"]`);

// A tool call and its result are two events; when both are on the page the result folds into the call's
// card, so a call reads as one unit of input and output. The result's own node stays (hidden) for its anchor.
export function fold(list) {
  for (const result of list.querySelectorAll(".ev[data-result-for]:not(.folded)")) {
    const call = callOf(list, result.dataset.resultFor);
    if (!call) continue;
    const slot = call.querySelector(".call-result");
    slot.replaceChildren(...result.querySelector(".ev-body").cloneNode(true).childNodes);
    const link = document.createElement("a");
    link.className = "seq";
    link.href = result.querySelector(".ev-head .seq")?.getAttribute("href") ?? "";
    link.textContent = `#${result.dataset.seq} `;
    slot.firstElementChild?.prepend(link);
    call.classList.add("answered");
    call.classList.toggle("is-error", result.classList.contains("is-error"));
    result.classList.add("folded");
    result.dataset.foldedInto = call.id;
  }
  for (const answer of list.querySelectorAll(".ev[data-answers]")) {
    callOf(list, answer.dataset.answers)?.classList.add("answered");
  }
}

// After nodes were dropped: a result whose call is no longer on the page shows on its own again.
export function unfoldOrphans(list) {
  for (const result of list.querySelectorAll(".ev.folded")) {
    if (!list.querySelector(`#${CSS.escape(result.dataset.foldedInto)}`)) result.classList.remove("folded");
  }
}
