import { useEffect, useState } from "preact/hooks";
import { api, type WorkspaceRow } from "./protocol";

const REFRESH_MS = 3000;

export function formatTime(ms: number): string {
  return ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) + "Z" : "—";
}

export function WorkspacesPage(props: { token: string; onOpen: (workspace: string) => void }) {
  const [rows, setRows] = useState<WorkspaceRow[] | null>(null);
  const [error, setError] = useState("");
  useEffect(() => {
    let live = true;
    const load = () =>
      api
        .workspaces(props.token)
        .then((r) => live && (setRows(r), setError("")))
        .catch((e: Error) => live && setError(e.message));
    void load();
    const timer = setInterval(load, REFRESH_MS);
    return () => {
      live = false;
      clearInterval(timer);
    };
  }, [props.token]);
  return (
    <main class="page">
      <h2>Workspaces</h2>
      {error && <p class="error">{error}</p>}
      {rows === null ? (
        <p>Loading…</p>
      ) : rows.length === 0 ? (
        <p>No workspace this token may read has events yet.</p>
      ) : (
        <table class="grid" data-testid="workspaces">
          <thead>
            <tr>
              <th>Workspace</th>
              <th class="num">Head</th>
              <th>Last activity (UTC)</th>
            </tr>
          </thead>
          <tbody>
            {rows.map((r) => (
              <tr key={r.workspace}>
                <td>
                  <a
                    href={`/ui/w/${encodeURIComponent(r.workspace)}`}
                    onClick={(e) => {
                      e.preventDefault();
                      props.onOpen(r.workspace);
                    }}
                  >
                    {r.workspace}
                  </a>
                </td>
                <td class="num">{r.head}</td>
                <td>{formatTime(r.lastActivity)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </main>
  );
}
