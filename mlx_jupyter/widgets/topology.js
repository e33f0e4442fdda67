// Front end of mlx_jupyter.widgets.TopologyWidget (anywidget ESM).
// Draws the JSON model (hosts, cables, marks) as SVG and sends button presses to the kernel.

const NS = "http://www.w3.org/2000/svg";
const BOX_W = 150, BOX_H = 50, FOREIGN_W = 150, FOREIGN_H = 44, MARGIN = 30;
const MISSING = "#dc2626", FOREIGN = "#9ca3af", ONE_SIDED = "#ea580c";
// cable check results (the "Check cables" button) colour the cables they measured
const CHECKED = { ok: "#16a34a", flagged: "#dc2626", failed: "#6b7280" };
const LEGEND = [
  ["#2563eb", null, "Thunderbolt 5 (80 Gb/s+)"],
  ["#f59e0b", null, "Thunderbolt 4 (40 Gb/s)"],
  ["#a855f7", null, "slower"],
  [ONE_SIDED, "2 4", "seen from one end only"],
  [MISSING, "6 4", "missing for a full mesh"],
  [FOREIGN, "6 4", "not in the host list"],
];
const CHECK_LEGEND = [
  [CHECKED.ok, null, "checked: fast enough"],
  [CHECKED.flagged, null, "checked: slow or asymmetric"],
  [CHECKED.failed, "1 4", "check failed"],
];

function svg(tag, attrs = {}, parent = null) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}

function html(tag, attrs = {}, parent = null, text = null) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== null) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

function label(parent, x, y, text, cls, anchor = "middle") {
  const t = svg("text", { x, y, class: cls, "text-anchor": anchor, "dominant-baseline": "middle" }, parent);
  t.textContent = text;
  return t;
}

// A label placed by the kernel (mlx_jupyter/widgets/topology_layout.py), clear of every line and other label.
function placed(parent, l) {
  return label(parent, l.x, l.y, l.text, l.cls);
}

function title(parent, text) {
  svg("title", {}, parent).textContent = text;
}

function drawGraph(m, selected, onSelect) {
  const hosts = m.hosts || [];
  const xs = hosts.map((h) => h.x), ys = hosts.map((h) => h.y);
  for (const c of m.cables || []) if (c.b === null && c.x !== undefined) { xs.push(c.x); ys.push(c.y); }
  if (!xs.length) { xs.push(0); ys.push(0); }
  const ext = m.extent || null;  // the placed labels' bounds
  const left = Math.min(Math.min(...xs) - BOX_W / 2, ext ? ext[0] : Infinity) - MARGIN;
  const right = Math.max(Math.max(...xs) + BOX_W / 2, ext ? ext[2] : -Infinity) + MARGIN;
  const checked = (m.cables || []).some((c) => c.check);
  const legend = checked ? LEGEND.concat(CHECK_LEGEND) : LEGEND;
  const rows = Math.ceil(legend.length / 3);
  const top = Math.min(Math.min(...ys) - BOX_H / 2, ext ? ext[1] : Infinity) - MARGIN;
  const bottom = Math.max(Math.max(...ys) + BOX_H / 2, ext ? ext[3] : -Infinity) + MARGIN + 12 + rows * 16;
  const width = Math.max(right - left, 600), height = bottom - top;
  const root = svg("svg", { viewBox: `${left} ${top} ${width} ${height}`, width, height, class: "mlxj-graph", role: "img" });
  title(root, m.summary || "topology");
  const byHost = (i) => hosts[i];

  // missing mesh links first, under everything
  for (const ml of m.missing_lines || []) {
    const a = byHost(ml.a), b = byHost(ml.b);
    const g = svg("g", { class: "mlxj-missing" }, root);
    title(g, `no cable between ${a.name} and ${b.name}`);
    const [x1, y1, x2, y2] = ml.line;
    svg("line", { x1, y1, x2, y2, stroke: MISSING, "stroke-width": 2, "stroke-dasharray": "6 4" }, g);
    placed(g, ml.label);
  }

  // cables between listed hosts, parallel ones side by side
  const pairs = new Map();
  for (const c of m.cables || []) {
    if (c.b === null) continue;
    const key = `${Math.min(c.a, c.b)},${Math.max(c.a, c.b)}`;
    if (!pairs.has(key)) pairs.set(key, []);
    pairs.get(key).push(c);
  }
  for (const cables of pairs.values()) {
    cables.forEach((c, k) => {
      const a = byHost(c.a), b = byHost(c.b);
      const [x1, y1, x2, y2] = c.line;
      const dim = selected !== null && c.a !== selected && c.b !== selected;
      const g = svg("g", { class: `mlxj-cable mlxj-${c.kind}${c.one_sided ? " mlxj-one-sided" : ""}${dim ? " mlxj-dim" : ""}`,
                           "data-cable": c.id }, root);
      let tip = `${a.name} ${c.a_iface} — ${b.name} ${c.b_iface}, ${c.speed}`;
      if (c.generation) tip += ` (Thunderbolt ${c.generation})`;
      if (c.via.length) tip += `, through ${c.via.join(", ")}`;
      if (c.one_sided) tip += `, seen only from ${c.seen_from.join(", ") || "neither end"}`;
      if (c.addresses) tip += `\n${c.addresses[0]} ↔ ${c.addresses[1]}`;
      const ck = c.check;
      if (ck) {
        g.setAttribute("class", `${g.getAttribute("class")} mlxj-checked mlxj-check-${ck.state}`);
        if (ck.error) tip += `\ncheck failed: ${ck.error}`;
        else tip += `\n${a.name} → ${b.name} ${ck.a_to_b_gbps.toFixed(2)} Gb/s, ${b.name} → ${a.name} ` +
                    `${ck.b_to_a_gbps.toFixed(2)} Gb/s` + (ck.rtt_ms !== null ? `, round trip ${ck.rtt_ms.toFixed(3)} ms` : "");
        for (const f of ck.flags || []) tip += `\n⚠ ${f}`;
      }
      title(g, tip);
      const stroke = ck ? CHECKED[ck.state] : c.one_sided ? ONE_SIDED : c.colour;
      const dash = ck ? (ck.state === "failed" ? "1 4" : null) : c.one_sided ? "2 4" : null;
      svg("line", { x1, y1, x2, y2, stroke, "stroke-width": ck && ck.state === "flagged" ? 5 : 3,
                    "stroke-linecap": "round", "stroke-dasharray": dash }, g);
      const mx = (x1 + x2) / 2, my = (y1 + y2) / 2;
      if (c.via.length) {
        svg("rect", { x: mx - 7, y: my - 7, width: 14, height: 14, rx: 3, class: "mlxj-hub", stroke: c.colour,
                      transform: `rotate(45 ${mx} ${my})` }, g);
      }
      for (const l of c.labels || []) {
        const t = placed(g, l);
        if (ck && l.cls.includes("mlxj-check-label") && l.text === ck.label) t.setAttribute("fill", CHECKED[ck.state]);
        else if (l.cls === "mlxj-speed") t.setAttribute("fill", c.colour);
      }
    });
  }

  // machines outside the host list
  for (const c of m.cables || []) {
    if (c.b !== null || c.x === undefined) continue;
    const a = byHost(c.a);
    const g = svg("g", { class: "mlxj-foreign" }, root);
    const name = c.foreign ? c.foreign.name + (c.foreign.model ? ` (${c.foreign.model})` : "") : "unlisted machine";
    title(g, `${a.name} ${c.a_iface} is cabled to ${name}, which is not in the host list`);
    const [x1, y1, x2, y2] = c.line;
    svg("line", { x1, y1, x2, y2, stroke: FOREIGN, "stroke-width": 2, "stroke-dasharray": "6 4" }, g);
    svg("rect", { x: c.x - FOREIGN_W / 2, y: c.y - FOREIGN_H / 2, width: FOREIGN_W, height: FOREIGN_H, rx: 8,
                  class: "mlxj-foreign-box" }, g);
    label(g, c.x, c.y - 7, name, "mlxj-foreign-name");
    label(g, c.x, c.y + 10, "not in host list", "mlxj-note");
    for (const l of c.labels || []) placed(g, l);
  }

  // hosts on top
  for (const h of hosts) {
    const g = svg("g", { class: `mlxj-host${selected === h.index ? " mlxj-selected" : ""}`, "data-host": h.name }, root);
    title(g, `${h.name}${h.ip ? ", " + h.ip : ""}, ${h.ports} Thunderbolt ports, RDMA ${h.rdma}` +
             `${h.sudo === false ? ", no passwordless sudo" : ""}\nclick to show its setup`);
    svg("rect", { x: h.x - BOX_W / 2, y: h.y - BOX_H / 2, width: BOX_W, height: BOX_H, rx: 8, class: "mlxj-host-box" }, g);
    label(g, h.x, h.y - 8, h.name, "mlxj-host-name");
    const sub = [h.machine, h.rdma === "enabled" ? "RDMA" : "no RDMA"].filter(Boolean).join(" · ");
    label(g, h.x, h.y + 11, sub, h.rdma === "enabled" ? "mlxj-rdma-on" : "mlxj-rdma-off");
    g.addEventListener("click", () => onSelect(selected === h.index ? null : h.index));
  }

  // legend: two rows of three under the drawing
  const lg = svg("g", { class: "mlxj-legend" }, root);
  legend.forEach(([colour, dash, text], k) => {
    const lx = left + 12 + (k % 3) * 190, ly = bottom - 2 - rows * 16 + Math.floor(k / 3) * 16;
    svg("line", { x1: lx, y1: ly, x2: lx + 20, y2: ly, stroke: colour, "stroke-width": 3, "stroke-dasharray": dash }, lg);
    label(lg, lx + 25, ly, text, "mlxj-note", "start");
  });
  return root;
}

function section(parent, heading, cls = "") {
  const box = html("div", { class: `mlxj-section ${cls}` }, parent);
  html("div", { class: "mlxj-heading" }, box, heading);
  return box;
}

function copyButton(parent, text) {
  const b = html("button", { class: "mlxj-copy", title: "copy to the clipboard" }, parent, "copy");
  b.addEventListener("click", () => navigator.clipboard && navigator.clipboard.writeText(text));
  return b;
}

function drawSide(m, setup, selected, side) {
  const be = m.backend || {};
  const choice = section(side, "Backend", "mlxj-backend");
  if (be.name) {
    html("span", { class: "mlxj-badge" }, choice, be.name);
    html("div", { class: "mlxj-reason" }, choice, be.reason);
    if (be.ring) html("div", { class: "mlxj-note-line" }, choice, `ring order: ${be.ring.join(" → ")}`);
    if (be.note) html("div", { class: "mlxj-note-line mlxj-fast-synch" }, choice, be.note);
  } else {
    html("span", { class: "mlxj-badge mlxj-badge-error" }, choice, "no backend");
    html("div", { class: "mlxj-reason mlxj-error-text" }, choice, be.error || "");
  }
  if ((m.missing || []).length) {
    const names = (i) => m.hosts[i].name;
    const diag = section(side, "Missing for a full mesh", "mlxj-diagnosis");
    const ul = html("ul", {}, diag);
    for (const [i, j] of m.missing) html("li", {}, ul, `${names(i)} ↔ ${names(j)}: no cable`);
  }
  if ((m.warnings || []).length) {
    const w = section(side, "Warnings", "mlxj-warnings");
    const ul = html("ul", {}, w);
    for (const text of m.warnings) html("li", {}, ul, text);
  }
  const plan = section(side, "Address plan (one /30 per cable)", "mlxj-plan");
  const table = html("table", {}, plan);
  const head = html("tr", {}, table);
  for (const c of ["host", "iface", "address", "", "peer", "iface", "address"]) html("th", {}, head, c);
  for (const r of m.plan || []) {
    const hostName = selected === null ? null : m.hosts[selected].name;
    const row = html("tr", hostName && r.a !== hostName && r.b !== hostName ? { class: "mlxj-dim" } : {}, table);
    for (const v of [r.a, r.a_iface, r.a_ip, "↔", r.b, r.b_iface, r.b_ip]) html("td", {}, row, v);
  }
  const hostsToShow = selected === null ? m.hosts : [m.hosts[selected]];
  const cmds = section(side, selected === null ? "Setup commands per host" : `Setup for ${m.hosts[selected].name}`, "mlxj-setup");
  for (const h of hostsToShow) {
    const res = setup[h.name];
    const lines = (m.setup || {})[h.name] || [];
    const det = html("details", selected === null ? {} : { open: "" }, cmds);
    let state = h.sudo === false ? "no passwordless sudo: run by hand" : "passwordless sudo";
    if (res) state = res.mode === "manual" ? "run these by hand" : res.ok ? "applied over ssh ✓" : "failed ✗";
    html("summary", { class: res && res.mode === "auto" && !res.ok ? "mlxj-error-text" : "" }, det, `${h.name} — ${state}`);
    const pre = html("pre", {}, det, lines.join("\n"));
    copyButton(det, lines.join("\n"));
    if (res && res.errors && res.errors.length) html("div", { class: "mlxj-error-text" }, det, res.errors.join("\n"));
    void pre;
  }
  if (be.hostfile) {
    const hf = section(side, "Hostfile", "mlxj-hostfile");
    const det = html("details", {}, hf);
    html("summary", {}, det, `${be.name}, ${be.hostfile.hosts.length} hosts`);
    const text = JSON.stringify(be.hostfile, null, 2);
    html("pre", {}, det, text);
    copyButton(det, text);
  }
}

function drawActions(model, bar) {
  const st = model.get("status") || {};
  const busy = !!st.busy;
  const send = (action) => model.send({ action });

  const hostsIn = html("input", { class: "mlxj-hosts", placeholder: "host1,host2,…", title: "ssh names, in rank order" }, bar);
  hostsIn.value = (model.get("hosts") || []).join(",");
  hostsIn.addEventListener("change", () => {
    model.set("hosts", hostsIn.value.split(",").map((s) => s.trim()).filter(Boolean));
    model.save_changes();
  });
  const button = (text, action, tip) => {
    const b = html("button", { class: `mlxj-btn mlxj-btn-${action}`, title: tip }, bar, text);
    if (busy) b.setAttribute("disabled", "");
    b.addEventListener("click", () => send(action));
    return b;
  };
  button("Discover", "discover", "ask each host for its Thunderbolt ports, peers and RDMA state");
  const sel = html("select", { class: "mlxj-backend-select", title: "backend (auto: the best the cabling supports)" }, bar);
  for (const b of ["", "ring", "jaccl", "jaccl-ring"]) {
    const o = html("option", { value: b }, sel, b || "auto");
    if ((model.get("backend") || "") === b) o.setAttribute("selected", "");
  }
  sel.addEventListener("change", () => { model.set("backend", sel.value); model.save_changes(); });
  button("Apply setup", "apply", "set the addresses over ssh where sudo allows; commands to copy elsewhere");
  button("Check cables", "check", "after setup: send over every cable both ways (about a second each, cables without " +
         "a shared host at once) and mark those under half their nominal speed, or much faster one way than the other");
  const path = html("input", { class: "mlxj-path", title: "hostfile path on the kernel's machine (a relative path " +
                    "is in the kernel's working directory: the notebook's folder); Save and Start say where they wrote it" }, bar);
  path.value = model.get("hostfile_path") || "hostfile.json";
  path.addEventListener("change", () => { model.set("hostfile_path", path.value); model.save_changes(); });
  button("Save hostfile", "save", "write the hostfile of the chosen backend");
  button("Start cluster", "start", "save the hostfile (path at the left) and start one rank per host");

  const line = html("div", { class: `mlxj-status mlxj-status-${st.level || "info"}` }, bar.parentNode);
  if (st.total) {
    const p = html("progress", { max: st.total, value: st.done || 0 }, line);
    void p;
  }
  html("span", { class: "mlxj-status-text" }, line, st.message || "");
}

export default {
  render({ model, el }) {
    let selected = null;
    const draw = () => {
      el.replaceChildren();
      const root = html("div", { class: "mlxj-topology" }, el);
      const m = model.get("model") || {};
      const head = html("div", { class: "mlxj-head" }, root);
      html("span", { class: "mlxj-title" }, head, "Thunderbolt cabling");
      html("span", { class: "mlxj-summary" }, head, m.summary || "no topology yet: type the hosts and press Discover");
      const body = html("div", { class: "mlxj-body" }, root);
      const left = html("div", { class: "mlxj-canvas" }, body);
      if (selected !== null && (!m.hosts || selected >= m.hosts.length)) selected = null;
      if (m.hosts && m.hosts.length) left.appendChild(drawGraph(m, selected, (i) => { selected = i; draw(); }));
      const side = html("div", { class: "mlxj-side" }, body);
      if (m.hosts && m.hosts.length) drawSide(m, model.get("setup_result") || {}, selected, side);
      const actions = html("div", { class: "mlxj-actions-wrap" }, root);
      drawActions(model, html("div", { class: "mlxj-actions" }, actions));
    };
    draw();
    for (const name of ["model", "status", "setup_result", "backend"]) model.on(`change:${name}`, draw);
    return () => { for (const name of ["model", "status", "setup_result", "backend"]) model.off(`change:${name}`, draw); };
  },
};
