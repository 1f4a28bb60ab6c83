// Page-wide behaviour the server cannot provide: a banner when a request fails outright (operator
// errors come back as fragments and are swapped in place), and copying a new API key.

const banner = () => document.getElementById("banner");

export function showBanner(message, { error = true } = {}) {
  const element = banner();
  if (!element) return;
  element.textContent = message;
  element.classList.toggle("error", error);
  element.hidden = false;
}

document.addEventListener("htmx:beforeSwap", (event) => {
  event.detail.xhr.wbSwapped = event.detail.shouldSwap;
});

document.addEventListener("htmx:responseError", (event) => {
  const xhr = event.detail.xhr;
  if (xhr.wbSwapped) return; // the server rendered the problem into the page
  showBanner(`The server could not do that (HTTP ${xhr.status}). ${xhr.status >= 500 ? "It has been logged; try again." : ""}`);
});

document.addEventListener("htmx:sendError", () => {
  showBanner("Could not reach the server. Check that Workbench is running, then try again.");
});

document.addEventListener("htmx:afterRequest", (event) => {
  if (event.detail.successful) banner()?.setAttribute("hidden", "");
});

document.addEventListener("click", async (event) => {
  const button = event.target.closest("[data-copy]");
  if (!button) return;
  const field = document.querySelector(button.dataset.copy);
  field.select();
  try {
    await navigator.clipboard.writeText(field.value);
    button.textContent = "Copied";
  } catch {
    button.textContent = "Press Ctrl+C";
  }
});
