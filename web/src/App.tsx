// The shell: sign in, route, and keep one connection for the session. The token stays in
// sessionStorage (this tab only, gone when it closes), never in a URL.

import { useEffect, useState } from "preact/hooks";
import { AgoraError, Connection, api } from "./protocol";
import { parseRoute, resolveWsUrl, routeUrl, type Route } from "./route";
import { WorkspacesPage } from "./WorkspacesPage";
import { WorkspacePage } from "./WorkspacePage";

const TOKEN_KEY = "agora.token";
const WS_KEY = "agora.wsUrl";

function currentRoute(): Route {
  return parseRoute(location.pathname, location.search);
}

export function App() {
  const [route, setRoute] = useState<Route>(currentRoute);
  const [conn, setConn] = useState<Connection | null>(null);
  const [token, setToken] = useState<string>(() => sessionStorage.getItem(TOKEN_KEY) ?? "");
  const [wsUrl, setWsUrl] = useState<string>(() => sessionStorage.getItem(WS_KEY) ?? "");
  const [error, setError] = useState<string>("");
  const [busy, setBusy] = useState(false);
  const [after, setAfter] = useState<Route>(() => {
    const r = currentRoute();
    return r.page === "signin" ? { page: "workspaces" } : r;
  });

  const navigate = (next: Route, replace = false) => {
    const url = routeUrl(next);
    if (url !== location.pathname + location.search) {
      if (replace) history.replaceState(null, "", url);
      else history.pushState(null, "", url);
    }
    setRoute(next);
  };

  useEffect(() => {
    const onPop = () => setRoute(currentRoute());
    addEventListener("popstate", onPop);
    return () => removeEventListener("popstate", onPop);
  }, []);

  useEffect(() => {
    if (wsUrl) return;
    api
      .config()
      .then((c) => setWsUrl((old) => old || resolveWsUrl(c.wsUrl, location.hostname)))
      .catch(() => setWsUrl(resolveWsUrl(null, location.hostname)));
  }, []);

  const signIn = async (tokenValue: string, url: string) => {
    setBusy(true);
    setError("");
    try {
      const c = await Connection.open(url, tokenValue.trim());
      c.onClose = (code, reason) => {
        setConn(null);
        setError(`disconnected (${code}${reason ? `: ${reason}` : ""})`);
        navigate({ page: "signin" }, true);
      };
      sessionStorage.setItem(TOKEN_KEY, tokenValue.trim());
      sessionStorage.setItem(WS_KEY, url);
      setToken(tokenValue.trim());
      setConn(c);
      navigate(after, true);
    } catch (e) {
      setError(e instanceof AgoraError ? `${e.code}: ${e.message}` : String(e));
      navigate({ page: "signin" }, true);
    } finally {
      setBusy(false);
    }
  };

  // A deep link opened with a token already in this tab: connect without asking again.
  useEffect(() => {
    if (!conn && token && wsUrl && !busy && !error) void signIn(token, wsUrl);
  }, [wsUrl]);

  const signOut = () => {
    sessionStorage.removeItem(TOKEN_KEY);
    setToken("");
    conn?.close();
    setConn(null);
    setAfter({ page: "workspaces" });
    navigate({ page: "signin" });
  };

  if (!conn || route.page === "signin") {
    return (
      <SignIn
        busy={busy}
        error={error}
        token={token}
        wsUrl={wsUrl}
        onSubmit={(t, u) => {
          setError("");
          void signIn(t, u);
        }}
      />
    );
  }
  return (
    <div class="shell">
      <header class="topbar">
        <a
          class="brand"
          href="/ui/workspaces"
          onClick={(e) => {
            e.preventDefault();
            navigate({ page: "workspaces" });
          }}
        >
          Agora viewer
        </a>
        <span class="who" data-testid="agent">
          {conn.welcome?.agent} · {conn.welcome?.rights.join(", ")}
        </span>
        <button type="button" onClick={signOut}>
          Sign out
        </button>
      </header>
      {route.page === "workspaces" ? (
        <WorkspacesPage token={token} onOpen={(w) => navigate(workspaceRoute(w))} />
      ) : (
        <WorkspacePage
          key={route.workspace}
          conn={conn}
          token={token}
          route={route}
          navigate={(r) => navigate(r, true)}
        />
      )}
    </div>
  );
}

function workspaceRoute(workspace: string): Route {
  return { page: "workspace", workspace, seq: null, tab: "state", file: null, exec: null, from: null };
}

function SignIn(props: {
  busy: boolean;
  error: string;
  token: string;
  wsUrl: string;
  onSubmit: (token: string, wsUrl: string) => void;
}) {
  const [token, setToken] = useState(props.token);
  const [url, setUrl] = useState(props.wsUrl);
  useEffect(() => setUrl((u) => u || props.wsUrl), [props.wsUrl]);
  return (
    <main class="signin">
      <h1>Agora viewer</h1>
      <p>Sign in with a capability token with the read right (agora token issue …).</p>
      <form
        onSubmit={(e) => {
          e.preventDefault();
          props.onSubmit(token, url);
        }}
      >
        <label>
          Token
          <textarea
            name="token"
            data-testid="token"
            rows={4}
            value={token}
            onInput={(e) => setToken((e.target as HTMLTextAreaElement).value)}
          />
        </label>
        <label>
          Hub WebSocket URL
          <input
            name="wsUrl"
            data-testid="ws-url"
            value={url}
            onInput={(e) => setUrl((e.target as HTMLInputElement).value)}
          />
        </label>
        <button type="submit" disabled={props.busy || !token.trim() || !url}>
          Sign in
        </button>
        {props.error && (
          <p class="error" role="alert" data-testid="signin-error">
            {props.error}
          </p>
        )}
      </form>
    </main>
  );
}
