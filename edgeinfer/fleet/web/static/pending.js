// Pending devices (#/pending, admins): devices that asked for their certificate with a manual-approval claim, with
// the hardware facts they sent (serial, model, MAC), where from and when; Approve signs the device's certificate
// (its next request gets it), Reject refuses it for good. The requests are read again every few seconds (the
// change feed does not carry them), and after each decision.
import { api } from "./api.js";
import { h, setText, fmtTime, confirmDialog, emptyState, DASH } from "./dom.js";

const EVERY_MS = 5000;

export async function pendingPage(root) {
  const tbody = h("tbody");
  const empty = emptyState("No device is waiting for approval.");
  const status = h("p", { class: "muted", role: "status", "data-testid": "pending-status" });
  root.replaceChildren(h("div", { "data-testid": "pending" },
    h("div", { class: "page-head" },
      h("h1", {}, "Pending devices"),
      h("p", { class: "muted" }, "Devices that asked to join with a claim that needs an operator's approval.")),
    h("div", { class: "table-wrap" },
      h("table", { class: "data", "data-testid": "pending-table" },
        h("thead", {}, h("tr", {}, ["Device", "Serial", "Model", "MAC", "Groups", "Claim", "From", "Asked", ""]
          .map((label) => h("th", { scope: "col" }, label)))), tbody)),
    empty, status));

  async function decide(request, verb) {
    const question = verb === "approve"
      ? `Approve ${request.device_id} (serial ${request.serial})? It gets its certificate and joins ${request.groups.join(", ")}.`
      : `Reject ${request.device_id} (serial ${request.serial}) for good?`;
    if (!(await confirmDialog(question, verb === "approve" ? "Approve" : "Reject"))) return;
    try {
      await api(`provisioning/${encodeURIComponent(request.device_id)}/${verb}`, { method: "POST" });
      setText(status, `${verb === "approve" ? "Approved" : "Rejected"} ${request.device_id}.`);
      status.className = "muted";
    } catch (e) {
      setText(status, `Could not ${verb} ${request.device_id}: ${e.message}`);
      status.className = "error";
    }
    await load();
  }

  function row(r) {
    const hw = r.hardware || {};
    return h("tr", { dataset: { deviceId: r.device_id, state: r.state } },
      h("td", { dataset: { col: "device" } }, r.device_id),
      h("td", { dataset: { col: "serial" } }, r.serial),
      h("td", { dataset: { col: "model" } }, hw.model || DASH),
      h("td", { dataset: { col: "mac" } }, hw.mac || DASH),
      h("td", { dataset: { col: "groups" } }, (r.groups || []).join(", ") || DASH),
      h("td", { dataset: { col: "claim" } }, r.claim_id),
      h("td", { dataset: { col: "remote" } }, r.remote || DASH),
      h("td", { dataset: { col: "asked" } }, fmtTime(r.requested_at)),
      h("td", { class: "actions" },
        h("button", { type: "button", class: "primary", "data-testid": "approve", onclick: () => decide(r, "approve") },
          "Approve"),
        h("button", { type: "button", class: "danger", "data-testid": "reject", onclick: () => decide(r, "reject") },
          "Reject")));
  }

  async function load() {
    const requests = await api("provisioning?state=pending");
    tbody.replaceChildren(...requests.map(row));
    empty.hidden = requests.length > 0;
  }

  await load();
  const timer = setInterval(() => load().catch((e) => console.warn("pending devices: reading failed", e)), EVERY_MS);
  return { refresh: load, unmount: () => clearInterval(timer) };
}
