// One workspace: the live timeline (left) and, at the seq the slider points to, the state,
// a diff, an execution, the A2A tasks and the chain's verification (right). The whole log is
// followed over one subscription; state at a seq is the hub's own fold (`state atSeq`).

import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import { a2aTasks, board, fileTree, lineDiff, type TreeNode } from "./derive";
import {
  AgoraError,
  api,
  fileText,
  type AgoraEvent,
  type Connection,
  type WorkspaceState,
} from "./protocol";
import { TABS, type Route, type Tab } from "./route";
import {
  MAX_CATCH_UP,
  NO_FILTER,
  Timeline,
  execIdOf,
  summary,
  visibleRange,
  type Filter,
} from "./timeline";
import { formatTime } from "./WorkspacesPage";

type WsRoute = Extract<Route, { page: "workspace" }>;

const ROW_HEIGHT = 24;
const STATE_DEBOUNCE_MS = 120;
const STATE_MAX_WAIT_MS = 500;

export function WorkspacePage(props: {
  conn: Connection;
  token: string;
  route: WsRoute;
  navigate: (route: Route) => void;
}) {
  const { conn, route } = props;
  const timeline = useMemo(() => new Timeline(), [route.workspace]);
  const [version, setVersion] = useState(0);
  const [error, setError] = useState("");
  const [loaded, setLoaded] = useState(false);
  const [filter, setFilterState] = useState<Filter>(NO_FILTER);
  const setFilter = (next: Filter) => {
    setFilterState(next);
    timeline.setFilter(next);
  };
  const go = (changes: Partial<WsRoute>) => props.navigate({ ...route, ...changes });

  // Catch up on the log over HTTP (JSON Lines, chunk by chunk), then follow it live over the
  // WebSocket from the last seq read. Events are batched per animation frame, so 100,000 of
  // them render a handful of times, not 100,000.
  useEffect(() => {
    let buffer: AgoraEvent[] = [];
    let frame = 0;
    let head = Infinity;
    let active = true;
    let subscribed = false;
    const flush = () => {
      frame = 0;
      timeline.append(buffer);
      buffer = [];
      if (timeline.head >= head) setLoaded(true);
      setVersion(timeline.version);
    };
    const take = (events: AgoraEvent[]) => {
      for (const e of events) buffer.push(e);
      if (!frame && active) frame = requestAnimationFrame(flush);
    };
    api
      .catchUp(props.token, route.workspace, take, MAX_CATCH_UP)
      .catch(() => 0) // no HTTP catch-up (an older hub): the subscription replays it all
      .then((last) => {
        if (!active) return;
        subscribed = true;
        return conn.subscribe(route.workspace, last, (event) => take([event]));
      })
      .then((h) => {
        if (h === undefined) return;
        head = h;
        if (!frame) flush(); // says live when the log was already read to the head
      })
      .catch((e: AgoraError) => setError(`${e.code}: ${e.message}`));
    return () => {
      active = false;
      if (frame) cancelAnimationFrame(frame);
      if (subscribed && conn.isOpen) conn.unsubscribe(route.workspace).catch(() => undefined);
    };
  }, [conn, route.workspace]);

  const head = timeline.head;
  const seq = route.seq ?? head;

  const exportLog = async () => {
    const blob = await api.export(props.token, route.workspace);
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = `${route.workspace}.jsonl`;
    a.click();
    setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
  };

  return (
    <main class="workspace" data-version={version}>
      <div class="wsbar">
        <h2 data-testid="workspace-name">{route.workspace}</h2>
        <span data-testid="head">head {head}</span>
        <span class={loaded ? "live" : "loading"} data-testid="live">
          {loaded ? "● live" : "catching up…"}
        </span>
        <button type="button" data-testid="export" onClick={() => void exportLog()}>
          Export JSONL
        </button>
        {timeline.first > 1 && (
          <span class="muted" data-testid="bounded">
            timeline from seq {timeline.first} (the last {MAX_CATCH_UP.toLocaleString("en")}{" "}
            events at opening; the state views reach every seq)
          </span>
        )}
        {error && <span class="error">{error}</span>}
      </div>
      <div class="panes">
        <TimelinePane
          timeline={timeline}
          version={version}
          filter={filter}
          setFilter={setFilter}
          selected={seq}
          onSelect={(e) => {
            const exec = execIdOf(e);
            go({ seq: e.seq, ...(exec && route.tab === "exec" ? { exec } : {}) });
          }}
        />
        <section class="right">
          <SeqSlider
            head={Math.max(head, seq)}
            seq={seq}
            following={route.seq === null}
            onChange={(s) => go({ seq: s })}
            onFollow={() => go({ seq: null })}
          />
          <nav class="tabs">
            {TABS.map((t) => (
              <button
                type="button"
                key={t}
                data-testid={`tab-${t}`}
                class={t === route.tab ? "active" : ""}
                onClick={() => go({ tab: t as Tab })}
              >
                {TAB_NAMES[t]}
              </button>
            ))}
          </nav>
          {seq > 0 && (
            <StateView
              conn={conn}
              token={props.token}
              route={route}
              seq={seq}
              head={head}
              timeline={timeline}
              version={version}
              go={go}
              showItem={(correlationId) => setFilter({ ...NO_FILTER, correlationId })}
            />
          )}
        </section>
      </div>
    </main>
  );
}

const TAB_NAMES: Record<Tab, string> = {
  state: "State",
  diff: "Diff",
  exec: "Executions",
  tasks: "A2A tasks",
  verify: "Verify",
};

// -- the timeline -------------------------------------------------------------------------

function TimelinePane(props: {
  timeline: Timeline;
  version: number;
  filter: Filter;
  setFilter: (filter: Filter) => void;
  selected: number;
  onSelect: (event: AgoraEvent) => void;
}) {
  const { timeline, filter } = props;
  const [scrollTop, setScrollTop] = useState(0);
  const [viewport, setViewport] = useState(600);
  const [stick, setStick] = useState(true); // follow the newest event
  const box = useRef<HTMLDivElement>(null);

  const update = (changes: Partial<Filter>) => props.setFilter({ ...filter, ...changes });

  useEffect(() => {
    const el = box.current;
    if (!el) return;
    const observer = new ResizeObserver(() => setViewport(el.clientHeight));
    observer.observe(el);
    setViewport(el.clientHeight);
    return () => observer.disconnect();
  }, []);

  const count = timeline.size;
  useEffect(() => {
    const el = box.current;
    if (el && stick) el.scrollTop = el.scrollHeight;
  }, [props.version, count, stick]);

  const { start, end } = visibleRange(scrollTop, viewport, ROW_HEIGHT, count);
  const rows: preact.JSX.Element[] = [];
  for (let i = start; i < end; i++) {
    const e = timeline.at(i)!;
    rows.push(
      <div
        key={e.seq}
        class={`row${e.seq === props.selected ? " selected" : ""}`}
        style={{ top: `${i * ROW_HEIGHT}px` }}
        data-seq={e.seq}
        data-kind={e.kind}
        onClick={() => props.onSelect(e)}
      >
        <span class="seq">{e.seq}</span>
        <span class="time">{formatTime(e.timestamp).slice(11, 19)}</span>
        <span class="producer">{e.producer}</span>
        <span class={`kind k-${e.kind}`}>{e.kind}</span>
        <span class="corr">{e.correlationId ?? execIdOf(e) ?? ""}</span>
        <span class="sum">{summary(e)}</span>
      </div>,
    );
  }
  const options = (m: Map<string, number>) =>
    [...m.keys()].sort().map((k) => (
      <option key={k} value={k}>
        {k} ({m.get(k)})
      </option>
    ));

  return (
    <section class="timeline">
      <div class="filters">
        <select
          data-testid="filter-kind"
          value={filter.kinds[0] ?? ""}
          onChange={(e) => {
            const v = (e.target as HTMLSelectElement).value;
            update({ kinds: v ? [v] : [] });
          }}
        >
          <option value="">every kind</option>
          {options(timeline.kinds)}
        </select>
        <select
          data-testid="filter-producer"
          value={filter.producer}
          onChange={(e) => update({ producer: (e.target as HTMLSelectElement).value })}
        >
          <option value="">every producer</option>
          {options(timeline.producers)}
        </select>
        <select
          data-testid="filter-item"
          value={filter.correlationId}
          onChange={(e) => update({ correlationId: (e.target as HTMLSelectElement).value })}
        >
          <option value="">every work item</option>
          {options(timeline.correlations)}
        </select>
        <select
          data-testid="filter-exec"
          value={filter.execId}
          onChange={(e) => update({ execId: (e.target as HTMLSelectElement).value })}
        >
          <option value="">every execution</option>
          {options(timeline.executions)}
        </select>
        <input
          type="search"
          placeholder="search…"
          data-testid="filter-text"
          value={filter.text}
          onInput={(e) => update({ text: (e.target as HTMLInputElement).value })}
        />
        <span class="count" data-testid="timeline-count">
          {count} / {timeline.events.length}
        </span>
      </div>
      <div
        class="rows"
        ref={box}
        data-testid="timeline"
        onScroll={(e) => {
          const el = e.currentTarget as HTMLDivElement;
          setScrollTop(el.scrollTop);
          setStick(el.scrollTop + el.clientHeight >= el.scrollHeight - ROW_HEIGHT);
        }}
      >
        <div class="spacer" style={{ height: `${count * ROW_HEIGHT}px` }}>
          {rows}
        </div>
      </div>
    </section>
  );
}

function SeqSlider(props: {
  head: number;
  seq: number;
  following: boolean;
  onChange: (seq: number) => void;
  onFollow: () => void;
}) {
  return (
    <div class="slider">
      <label>
        state at seq{" "}
        <input
          type="number"
          min={1}
          max={props.head}
          value={props.seq}
          data-testid="seq-input"
          onChange={(e) => {
            const v = Number((e.target as HTMLInputElement).value);
            if (Number.isInteger(v) && v >= 1) props.onChange(Math.min(v, props.head));
          }}
        />
      </label>
      <input
        type="range"
        min={1}
        max={Math.max(1, props.head)}
        value={props.seq}
        data-testid="seq-slider"
        onInput={(e) => props.onChange(Number((e.target as HTMLInputElement).value))}
      />
      <label class="follow">
        <input
          type="checkbox"
          checked={props.following}
          data-testid="follow"
          onChange={(e) =>
            (e.target as HTMLInputElement).checked ? props.onFollow() : props.onChange(props.seq)
          }
        />
        follow head
      </label>
    </div>
  );
}

// -- the right-hand views -------------------------------------------------------------------

interface ViewProps {
  conn: Connection;
  token: string;
  route: WsRoute;
  seq: number;
  head: number;
  timeline: Timeline;
  version: number;
  go: (changes: Partial<WsRoute>) => void;
  showItem: (correlationId: string) => void;
}

/** The state at `seq`, fetched when the seq changes: debounced while the slider moves or
 * live events stream in, but at least every STATE_MAX_WAIT_MS so a busy log still updates. */
function useStateAt(conn: Connection, workspace: string, seq: number) {
  const [state, setState] = useState<WorkspaceState | null>(null);
  const [error, setError] = useState("");
  const lastFetch = useRef(0);
  useEffect(() => {
    let live = true;
    const since = performance.now() - lastFetch.current;
    const delay = Math.max(0, Math.min(STATE_DEBOUNCE_MS, STATE_MAX_WAIT_MS - since));
    const timer = setTimeout(() => {
      lastFetch.current = performance.now();
      conn
        .state(workspace, { atSeq: seq })
        .then((r) => live && (setState(r.state), setError("")))
        .catch((e: AgoraError) => live && setError(`${e.code}: ${e.message}`));
    }, delay);
    return () => {
      live = false;
      clearTimeout(timer);
    };
  }, [conn, workspace, seq]);
  return { state, error };
}

function StateView(props: ViewProps) {
  const { state, error } = useStateAt(props.conn, props.route.workspace, props.seq);
  if (error) return <p class="error">{error}</p>;
  if (!state) return <p>Loading state…</p>;
  switch (props.route.tab) {
    case "state":
      return <StateTab {...props} state={state} />;
    case "diff":
      return <DiffTab {...props} state={state} />;
    case "exec":
      return <ExecTab {...props} state={state} />;
    case "tasks":
      return <TasksTab state={state} />;
    case "verify":
      return <VerifyTab {...props} />;
  }
}

function Tree(props: { nodes: TreeNode[]; selected: string | null; onOpen: (p: string) => void }) {
  return (
    <ul class="tree">
      {props.nodes.map((n) =>
        n.children ? (
          <li key={n.path} class="dir">
            <span>{n.name}/</span>
            <Tree nodes={n.children} selected={props.selected} onOpen={props.onOpen} />
          </li>
        ) : (
          <li key={n.path}>
            <a
              href="#"
              data-testid={`file-${n.path}`}
              class={n.path === props.selected ? "selected" : ""}
              onClick={(e) => {
                e.preventDefault();
                props.onOpen(n.path);
              }}
            >
              {n.name}
            </a>
          </li>
        ),
      )}
    </ul>
  );
}

function useFileAt(conn: Connection, workspace: string, path: string | null, seq: number) {
  const [content, setContent] = useState<{ text: string | null; exists: boolean } | null>(null);
  useEffect(() => {
    if (!path) return setContent(null);
    let live = true;
    conn
      .fileAt(workspace, path, seq)
      .then((entry) => {
        if (!live) return;
        const text = fileText(entry);
        setContent({ text, exists: entry !== null });
      })
      .catch(() => live && setContent({ text: null, exists: false }));
    return () => {
      live = false;
    };
  }, [conn, workspace, path, seq]);
  return content;
}

function StateTab(props: ViewProps & { state: WorkspaceState }) {
  const { state, route } = props;
  const files = state.files ?? {};
  const tree = useMemo(() => fileTree(Object.keys(files)), [state]);
  const content = useFileAt(props.conn, route.workspace, route.file, props.seq);
  const entry = route.file ? files[route.file] : undefined;
  return (
    <div class="state" data-testid="state-view" data-seq={state.seq}>
      <div class="files">
        <h3>Files at seq {state.seq}</h3>
        {tree.length === 0 ? (
          <p class="muted">no files</p>
        ) : (
          <Tree nodes={tree} selected={route.file} onOpen={(file) => props.go({ file })} />
        )}
      </div>
      <div class="content">
        {route.file && (
          <>
            <h3>
              {route.file}
              {entry && (
                <span class="muted">
                  {" "}
                  rev {entry.rev} · {entry.size} B · by {entry.producer} at seq {entry.seq}
                </span>
              )}
            </h3>
            <pre data-testid="file-content">
              {content === null
                ? "…"
                : !content.exists
                  ? "(no such file at this seq)"
                  : (content.text ?? "(binary or blob content)")}
            </pre>
          </>
        )}
      </div>
      <div class="board" data-testid="board">
        <h3>Work items</h3>
        <div class="columns">
          {board(state.workItems ?? {})
            .filter(([, items]) => items.length > 0)
            .map(([status, items]) => (
              <div class="column" key={status}>
                <h4>{status}</h4>
                {items.map(([id, item]) => (
                  <div
                    class="card"
                    key={id}
                    data-testid={`item-${id}`}
                    title="show this item's events in the timeline"
                    onClick={() => props.showItem(id)}
                  >
                    <b>{id}</b>
                    <div>owner {item.owner ?? "—"}</div>
                    <ol class="lifecycle" data-testid={`lifecycle-${id}`}>
                      {props.timeline.lifecycle(id, state.seq).map((step) => (
                        <li key={step.seq}>
                          {step.kind} <span class="muted">#{step.seq} {step.producer}</span>
                        </li>
                      ))}
                    </ol>
                  </div>
                ))}
              </div>
            ))}
        </div>
      </div>
      <div class="facts">
        <h3>Members</h3>
        <ul data-testid="members">
          {Object.entries(state.members ?? {}).map(([agent, m]) => (
            <li key={agent}>
              {agent} <span class="muted">{m.present ? "present" : "left"}{m.via ? ` via ${m.via}` : ""}</span>
            </li>
          ))}
        </ul>
        <h3>Executions</h3>
        <ul>
          {Object.entries(state.executions ?? {}).map(([id, x]) => (
            <li key={id}>
              <a
                href="#"
                onClick={(e) => {
                  e.preventDefault();
                  props.go({ tab: "exec", exec: id });
                }}
              >
                {id}
              </a>{" "}
              <span class="muted">
                {x.backend} · {x.status}
                {x.exitCode !== undefined ? ` · exit ${x.exitCode}` : ""}
              </span>
            </li>
          ))}
        </ul>
        <h3>Artifacts</h3>
        <ul>
          {Object.entries(state.artifacts ?? {}).map(([key, a]) => (
            <li key={key}>
              {key}{" "}
              <span class="muted">
                {a.sizeBytes} B · {a.mediaType ?? ""} {a.execId ? `· exec ${a.execId}` : ""}
              </span>
            </li>
          ))}
        </ul>
        <p class="muted">{state.messages ?? 0} messages</p>
      </div>
    </div>
  );
}

function DiffTab(props: ViewProps & { state: WorkspaceState }) {
  const { route, state } = props;
  const paths = Object.keys(state.files ?? {}).sort();
  const file = route.file ?? paths[0] ?? null;
  const entry = file ? state.files?.[file] : undefined;
  // Default: from just before the revision the file has at `seq`.
  const from = route.from ?? Math.max(0, (entry?.seq ?? props.seq) - 1);
  const [lines, setLines] = useState<ReturnType<typeof lineDiff> | null>(null);
  useEffect(() => {
    if (!file) return;
    let live = true;
    const before =
      from > 0 ? props.conn.fileAt(route.workspace, file, from) : Promise.resolve(null);
    Promise.all([before, props.conn.fileAt(route.workspace, file, props.seq)])
      .then(([a, b]) => live && setLines(lineDiff(fileText(a), fileText(b))))
      .catch(() => live && setLines(null));
    return () => {
      live = false;
    };
  }, [file, from, props.seq]);
  return (
    <div class="diff" data-testid="diff-view">
      <div class="diffbar">
        <select
          data-testid="diff-file"
          value={file ?? ""}
          onChange={(e) => props.go({ file: (e.target as HTMLSelectElement).value })}
        >
          {paths.map((p) => (
            <option key={p} value={p}>
              {p}
            </option>
          ))}
        </select>
        <label>
          from seq{" "}
          <input
            type="number"
            min={0}
            max={props.seq}
            value={from}
            data-testid="diff-from"
            onChange={(e) => props.go({ from: Number((e.target as HTMLInputElement).value) })}
          />
        </label>
        <span>to seq {props.seq}</span>
      </div>
      <pre class="difflines">
        {lines?.map((l, i) => (
          <div key={i} class={l.op === "+" ? "add" : l.op === "-" ? "del" : ""}>
            {l.op} {l.text}
          </div>
        ))}
      </pre>
    </div>
  );
}

interface ExecView {
  request?: AgoraEvent;
  output: string;
  finished?: AgoraEvent;
  status?: string;
}

function ExecTab(props: ViewProps & { state: WorkspaceState }) {
  const { route, state } = props;
  const ids = Object.keys(state.executions ?? {});
  const exec = route.exec ?? ids[ids.length - 1] ?? null;
  const [view, setView] = useState<ExecView>({ output: "" });
  // A deep link may name an execution before it exists: stream it once the state has it.
  const known = exec !== null && state.executions?.[exec] !== undefined;
  useEffect(() => {
    if (!exec || !known) return;
    let live = true;
    const acc: ExecView = { output: "" };
    setView({ output: "" });
    props.conn
      .getExec(route.workspace, exec, (event, text) => {
        if (!live) return;
        if (event.kind === "execRequested") acc.request = event;
        if (event.kind === "execOutput") {
          acc.output += text ?? decodeBase64(event.payload?.data);
        }
        if (event.kind === "execFinished") acc.finished = event;
        setView({ ...acc });
      })
      .then((status) => live && setView({ ...acc, status }))
      .catch((e: AgoraError) => live && setView({ ...acc, status: `${e.code}: ${e.message}` }));
    return () => {
      live = false;
    };
  }, [exec, known]);
  const p = view.request?.payload ?? {};
  const f = view.finished?.payload;
  const artifacts = Object.entries(state.artifacts ?? {}).filter(([, a]) => a.execId === exec);
  return (
    <div class="exec" data-testid="exec-view">
      <select
        data-testid="exec-select"
        value={exec ?? ""}
        onChange={(e) => props.go({ exec: (e.target as HTMLSelectElement).value })}
      >
        {ids.map((id) => (
          <option key={id} value={id}>
            {id}
          </option>
        ))}
      </select>
      {exec && (
        <>
          <h3>
            {exec} <span class="muted">on {String(p.backend ?? "?")}</span>
          </h3>
          <pre class="command" data-testid="exec-command">
            {String(p.source ?? (Array.isArray(p.argv) ? p.argv.join(" ") : ""))}
          </pre>
          <h4>Output</h4>
          <pre class="output" data-testid="exec-output">
            {view.output}
          </pre>
          <h4>Result</h4>
          <p data-testid="exec-result">
            {f
              ? `${String(f.status)} (${String(f.reason)}), exit ${String(f.exitCode ?? -1)}, ${String(f.durationMs ?? "?")} ms`
              : known
                ? (view.status ?? "running…")
                : "not started at this seq"}
          </p>
          {artifacts.length > 0 && (
            <ul>
              {artifacts.map(([k, a]) => (
                <li key={k}>
                  {k} <span class="muted">{a.sizeBytes} B</span>
                </li>
              ))}
            </ul>
          )}
        </>
      )}
    </div>
  );
}

function decodeBase64(data: unknown): string {
  if (typeof data !== "string") return "";
  try {
    return new TextDecoder().decode(Uint8Array.from(atob(data), (c) => c.charCodeAt(0)));
  } catch {
    return "";
  }
}

function TasksTab(props: { state: WorkspaceState }) {
  const tasks = a2aTasks(props.state.workItems ?? {}, props.state.executions ?? {});
  return (
    <table class="grid" data-testid="tasks">
      <thead>
        <tr>
          <th>Task id</th>
          <th>Type</th>
          <th>A2A state</th>
          <th>Agora status</th>
        </tr>
      </thead>
      <tbody>
        {tasks.map((t) => (
          <tr key={t.taskId}>
            <td>{t.taskId}</td>
            <td>{t.type}</td>
            <td>{t.state}</td>
            <td>{t.status}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

function VerifyTab(props: ViewProps) {
  const [result, setResult] = useState<string>("checking…");
  const [note, setNote] = useState<string>("");
  const [round, setRound] = useState(0); // the check reads the whole chain: on demand only
  useEffect(() => {
    let live = true;
    setResult("checking…");
    api
      .verify(props.token, props.route.workspace)
      .then(
        (r) =>
          live &&
          setResult(
            r.ok
              ? `chain OK: ${r.checked} events checked, head ${r.head}`
              : `chain BROKEN: ${JSON.stringify(r.error)}`,
          ),
      )
      .catch((e: Error) => live && setResult(e.message));
    props.conn
      .checkpoint(props.route.workspace)
      .then((c) => live && setNote(`checkpoint size ${c.size}\n${c.note}`))
      .catch((e: AgoraError) => live && setNote(`${e.code}: ${e.message}`));
    return () => {
      live = false;
    };
  }, [round]);
  return (
    <div class="verify" data-testid="verify-view">
      <p data-testid="verify-result">{result}</p>
      <button type="button" data-testid="verify-again" onClick={() => setRound(round + 1)}>
        Check again
      </button>
      <pre>{note}</pre>
    </div>
  );
}
