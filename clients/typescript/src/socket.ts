/**
 * The one WebSocket the session uses: the global `WebSocket` in browsers (and on Node when
 * asked), the `ws` package on Node (it is loaded only there; bundlers map it away through the
 * package's `browser` field).
 */

export interface SocketLike {
  readonly readyState: number;
  binaryType: string;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  send(data: string): void;
  close(code?: number, reason?: string): void;
}

/** What builds a socket: `new WebSocket(url, protocols)`. */
export type SocketFactory = (url: string, protocols: string[], maxPayload: number) => SocketLike;

const OPEN = 1;

function isNode(): boolean {
  const proc = (globalThis as { process?: { versions?: { node?: string } } }).process;
  return typeof proc?.versions?.node === "string";
}

/** The default factory: `ws` on Node, the global `WebSocket` elsewhere. */
export async function defaultFactory(): Promise<SocketFactory> {
  if (isNode()) {
    const mod = await import("ws");
    const WS = mod.WebSocket;
    return (url, protocols, maxPayload) =>
      new WS(url, protocols, { maxPayload, perMessageDeflate: false }) as unknown as SocketLike;
  }
  const Global = (globalThis as { WebSocket?: new (u: string, p: string[]) => SocketLike })
    .WebSocket;
  if (Global === undefined) throw new Error("no WebSocket implementation: pass `socketFactory`");
  return (url, protocols) => new Global(url, protocols);
}

export function isOpen(socket: SocketLike): boolean {
  return socket.readyState === OPEN;
}

/** The text of a message event (`ws` hands text frames over as Buffers). */
export function messageText(data: unknown): string | null {
  if (typeof data === "string") return data;
  if (data instanceof ArrayBuffer) return new TextDecoder().decode(data);
  if (ArrayBuffer.isView(data)) return new TextDecoder().decode(data);
  return null;
}
