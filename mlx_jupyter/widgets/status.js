// Front end of mlx_jupyter.widgets.ClusterStatusWidget (anywidget ESM).
// The kernel pushes rows when they change; the "cell time" clock ticks here, once a second,
// only while a rank is busy, so watching a long cell costs the kernel nothing.

function cell(row, text, cls = "") {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function seconds(since) {
  if (since === null || since === undefined) return "";
  const s = Math.max(0, Date.now() / 1000 - since);
  return s < 60 ? `${s.toFixed(0)} s` : `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
}

export default {
  render({ model, el }) {
    let timer = null;
    const clocks = [];
    const tick = () => { for (const [td, since] of clocks) td.textContent = seconds(since); };
    const draw = () => {
      el.replaceChildren();
      clocks.length = 0;
      const root = document.createElement("div");
      root.className = "mlxj-status-widget";
      const head = document.createElement("div");
      head.className = "mlxj-status-head";
      head.textContent = `MLX cluster ${model.get("cluster_id") || ""} — ${model.get("message") || ""}`;
      root.appendChild(head);
      const rows = model.get("rows") || [];
      if (rows.length) {
        const table = document.createElement("table");
        const hr = document.createElement("tr");
        for (const c of ["rank", "host", "pid", "state", "cell time", "memory"]) {
          const th = document.createElement("th");
          th.textContent = c;
          hr.appendChild(th);
        }
        table.appendChild(hr);
        for (const r of rows) {
          const tr = document.createElement("tr");
          tr.className = `mlxj-state-${String(r.state).split(" ")[0]}`;
          cell(tr, String(r.rank));
          cell(tr, r.host);
          cell(tr, r.pid === null ? "?" : String(r.pid));
          cell(tr, r.state, "mlxj-state");
          clocks.push([cell(tr, seconds(r.busy_since), "mlxj-clock"), r.busy_since]);
          cell(tr, r.memory, "mlxj-num");   // formatted by mlx_jupyter.cluster.cells.text.format_bytes
          table.appendChild(tr);
        }
        root.appendChild(table);
      }
      el.appendChild(root);
      const anyBusy = rows.some((r) => r.busy_since !== null && r.busy_since !== undefined);
      if (anyBusy && timer === null) timer = setInterval(tick, 1000);
      if (!anyBusy && timer !== null) { clearInterval(timer); timer = null; }
    };
    draw();
    for (const n of ["rows", "message", "cluster_id"]) model.on(`change:${n}`, draw);
    return () => {
      if (timer !== null) clearInterval(timer);
      for (const n of ["rows", "message", "cluster_id"]) model.off(`change:${n}`, draw);
    };
  },
};
