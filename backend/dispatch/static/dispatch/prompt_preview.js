/*
 * Baton's prompt preview follows the operator's draft.
 *
 * As the operator edits a cap value, the task or the policy on the preview page, this posts
 * the form to the draft endpoint (`preview/draft/`, see backend/dispatch/admin_preview.py)
 * 300 ms after the last keystroke and puts the preview section it answers in place: no page
 * reload, nothing saved. Editing a cap selects "Edited values below (unsaved)". An answer that
 * arrives after a newer request was sent is dropped, so the preview always shows the latest
 * draft. A refused draft (400) marks each field with its reason and keeps the last preview.
 * Without JavaScript the page's Preview button does the same by loading the page.
 */
"use strict";

(function () {
  const DEBOUNCE_MS = 300;
  const form = document.getElementById("prompt-preview-form");
  const result = document.getElementById("preview-result");
  const status = document.getElementById("live-preview-status");
  if (!form || !result || !window.fetch) {
    return;
  }
  const policy = form.elements.namedItem("policy");
  const task = form.elements.namedItem("task");
  const valueFields = document.querySelectorAll("#policy-values input, #policy-values select");
  let timer = null;
  let latest = 0;
  let inFlight = null;

  function say(text, isError) {
    status.textContent = text;
    status.classList.toggle("errornote", Boolean(isError));
  }

  function rowOf(name) {
    return form.querySelector(".form-row.field-" + name);
  }

  function clearMarks() {
    form.querySelectorAll("ul.live-errors").forEach((list) => list.remove());
    form.querySelectorAll(".form-row.live-error").forEach((row) => {
      row.classList.remove("errors", "live-error");
    });
    form.querySelectorAll(".form-row.draft-changed").forEach((row) => {
      row.classList.remove("draft-changed");
    });
  }

  function showErrors(errors) {
    const elsewhere = [];
    Object.entries(errors).forEach(([name, messages]) => {
      const row = rowOf(name);
      if (!row) {
        elsewhere.push(messages.join(" "));
        return;
      }
      const list = document.createElement("ul");
      list.className = "errorlist live-errors";
      messages.forEach((message) => {
        const item = document.createElement("li");
        item.textContent = message;
        list.appendChild(item);
      });
      row.classList.add("errors", "live-error");
      row.prepend(list);
    });
    const named = Object.keys(errors).filter((name) => rowOf(name));
    say(
      "Not previewed: " + [...named.map((name) => name + " is invalid"), ...elsewhere].join("; ") +
        ". The preview below is of the last valid values.",
      true,
    );
  }

  function fill(values) {
    Object.entries(values).forEach(([name, value]) => {
      const field = form.elements.namedItem(name);
      if (!field) {
        return;
      }
      if (field.type === "checkbox") {
        field.checked = Boolean(value);
      } else {
        field.value = value === null ? "" : String(value);
      }
    });
  }

  function refresh() {
    timer = null;
    if (!task.value.trim()) {
      say("Enter a task id to preview its next prompt.");
      return;
    }
    const sequence = ++latest;
    if (inFlight) {
      inFlight.abort();
    }
    inFlight = new AbortController();
    say("Updating the preview…");
    fetch(form.dataset.draftUrl, {
      method: "POST",
      body: new URLSearchParams(new FormData(form)),
      headers: { "X-CSRFToken": form.dataset.csrfToken, Accept: "application/json" },
      credentials: "same-origin",
      signal: inFlight.signal,
    })
      .then((response) =>
        response.json().then((body) => ({ ok: response.ok, status: response.status, body })),
      )
      .then((answer) => {
        if (sequence !== latest) {
          return;
        }
        clearMarks();
        if (!answer.ok) {
          showErrors(answer.body.errors || { __all__: ["HTTP " + answer.status] });
          return;
        }
        result.innerHTML = answer.body.html;
        if (policy.value !== form.dataset.unsavedChoice) {
          fill(answer.body.values); // the saved policy shown, ready to be edited
        }
        answer.body.changed.forEach((change) => {
          const row = rowOf(change.field);
          if (row) {
            row.classList.add("draft-changed");
          }
        });
        // The address says what is shown, so a reload or a shared link shows it again.
        history.replaceState(null, "", "?" + new URLSearchParams(new FormData(form)));
        say(
          answer.body.changed.length
            ? "Preview updated: the draft changes " + answer.body.changed.length +
                " value(s) (not saved)."
            : "Preview updated.",
        );
      })
      .catch((error) => {
        if (error.name !== "AbortError" && sequence === latest) {
          say("The preview could not be updated (" + error.message + ").", true);
        }
      });
  }

  function schedule() {
    if (timer !== null) {
      clearTimeout(timer);
    }
    timer = setTimeout(refresh, DEBOUNCE_MS);
  }

  valueFields.forEach((field) => {
    const edited = () => {
      policy.value = form.dataset.unsavedChoice;
      schedule();
    };
    field.addEventListener("input", edited);
    field.addEventListener("change", edited);
  });
  [task, policy].forEach((field) => {
    field.addEventListener("input", schedule);
    field.addEventListener("change", schedule);
  });
})();
