// The timeline's state, without the DOM: the events of one workspace in seq order, the facets
// the filters offer (kinds, producers, work items, executions), and the filtered view as an
// array of indexes, kept up to date incrementally as live events arrive (no re-scan of 100,000
// events per event).

import type { AgoraEvent } from "./protocol";

export interface Filter {
  kinds: string[]; // empty: every kind
  producer: string; // "": any
  correlationId: string; // "": any
  execId: string; // "": any
  text: string; // case-insensitive substring of the event's JSON
}

export const NO_FILTER: Filter = { kinds: [], producer: "", correlationId: "", execId: "", text: "" };

export function isEmpty(filter: Filter): boolean {
  return (
    filter.kinds.length === 0 &&
    !filter.producer &&
    !filter.correlationId &&
    !filter.execId &&
    !filter.text
  );
}

/** The execution an event belongs to (exec* kinds and artifacts carry payload.execId). */
export function execIdOf(event: AgoraEvent): string | undefined {
  const id = event.payload?.execId;
  return typeof id === "string" ? id : undefined;
}

/** A one-line human summary of an event for the timeline row. */
export function summary(event: AgoraEvent): string {
  const p = event.payload ?? {};
  const s = (v: unknown) => (typeof v === "string" ? v : "");
  switch (event.kind) {
    case "messagePosted":
      return s(p.text) || JSON.stringify(p.data ?? {});
    case "fileWritten":
      return `${s(p.path)} (${typeof p.size === "number" ? p.size : "?"} B)`;
    case "fileDeleted":
      return s(p.path);
    case "fileMoved":
      return `${s(p.from)} → ${s(p.to)}`;
    case "memberJoined":
    case "memberLeft":
      return `${s(p.agent)}${p.reason ? ` (${s(p.reason)})` : ""}`;
    case "execRequested":
      return `${s(p.execId)} on ${s(p.backend)}: ${s(p.source).slice(0, 80)}`;
    case "execOutput":
      return `${s(p.execId)} ${s(p.stream)} #${typeof p.n === "number" ? p.n : "?"}`;
    case "execFinished":
      return `${s(p.execId)} ${s(p.status)} (${s(p.reason)}, exit ${String(p.exitCode ?? -1)})`;
    case "execStarted":
    case "execDisposed":
    case "execCancelRequested":
      return s(p.execId);
    case "artifactPublished":
      return `${s(p.key)} (${String(p.sizeBytes ?? "?")} B)`;
    default: {
      const text = JSON.stringify(p);
      return text === "{}" ? "" : text.slice(0, 120);
    }
  }
}

/** The most events a page holds from the catch-up (about 150 MB of browser heap, measured at
 * 56-75 MB per 100,000 events); older history is left to the state views, which ask the hub. */
export const MAX_CATCH_UP = 250_000;

export class Timeline {
  readonly events: AgoraEvent[] = [];
  readonly kinds = new Map<string, number>();
  readonly producers = new Map<string, number>();
  readonly correlations = new Map<string, number>();
  readonly executions = new Map<string, number>();
  /** Each work item's events (indexes into `events`), for its lifecycle. */
  readonly byCorrelation = new Map<string, number[]>();
  private searchText: (string | undefined)[] = [];
  private filter: Filter = NO_FILTER;
  private view: number[] | null = null; // null: no filter, every event
  /** Bumped on every change, for the UI to know when to re-render. */
  version = 0;

  /** The first seq held (1 unless the catch-up was bounded by MAX_CATCH_UP). */
  get first(): number {
    return this.events.length === 0 ? 0 : this.events[0]!.seq;
  }

  get head(): number {
    return this.events.length === 0 ? 0 : this.events[this.events.length - 1]!.seq;
  }

  /** Add events (in seq order; a seq already held is ignored: a resubscribe may repeat). */
  append(events: AgoraEvent[]): void {
    for (const event of events) {
      if (event.seq <= this.head) continue;
      const index = this.events.length;
      this.events.push(event);
      bump(this.kinds, event.kind);
      bump(this.producers, event.producer);
      if (event.correlationId) {
        bump(this.correlations, event.correlationId);
        const list = this.byCorrelation.get(event.correlationId);
        if (list) list.push(index);
        else this.byCorrelation.set(event.correlationId, [index]);
      }
      const exec = execIdOf(event);
      if (exec) bump(this.executions, exec);
      if (this.view !== null && this.matches(index)) this.view.push(index);
    }
    this.version++;
  }

  setFilter(filter: Filter): void {
    this.filter = { ...filter, text: filter.text.trim().toLowerCase() };
    if (isEmpty(this.filter)) {
      this.view = null;
    } else {
      const view: number[] = [];
      for (let i = 0; i < this.events.length; i++) if (this.matches(i)) view.push(i);
      this.view = view;
    }
    this.version++;
  }

  getFilter(): Filter {
    return this.filter;
  }

  /** How many events the filtered view holds. */
  get size(): number {
    return this.view === null ? this.events.length : this.view.length;
  }

  /** The `i`-th event of the filtered view. */
  at(i: number): AgoraEvent | undefined {
    const index = this.view === null ? i : this.view[i];
    return index === undefined ? undefined : this.events[index];
  }

  /** The position in the filtered view of the last event with seq <= `seq` (-1: none). */
  positionOf(seq: number): number {
    let lo = 0;
    let hi = this.size - 1;
    let found = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (this.at(mid)!.seq <= seq) {
        found = mid;
        lo = mid + 1;
      } else hi = mid - 1;
    }
    return found;
  }

  /** A work item's steps up to `seq`: the kind, seq and producer of each of its events. */
  lifecycle(correlationId: string, seq: number): { kind: string; seq: number; producer: string }[] {
    const steps = [];
    for (const i of this.byCorrelation.get(correlationId) ?? []) {
      const e = this.events[i]!;
      if (e.seq > seq) break;
      steps.push({ kind: e.kind, seq: e.seq, producer: e.producer });
    }
    return steps;
  }

  private matches(index: number): boolean {
    const event = this.events[index]!;
    const f = this.filter;
    if (f.kinds.length > 0 && !f.kinds.includes(event.kind)) return false;
    if (f.producer && event.producer !== f.producer) return false;
    if (f.correlationId && event.correlationId !== f.correlationId) return false;
    if (f.execId && execIdOf(event) !== f.execId) return false;
    if (f.text) {
      let text = this.searchText[index];
      if (text === undefined) {
        text = JSON.stringify(event).toLowerCase(); // built once, on the first search
        this.searchText[index] = text;
      }
      if (!text.includes(f.text)) return false;
    }
    return true;
  }
}

function bump(map: Map<string, number>, key: string): void {
  map.set(key, (map.get(key) ?? 0) + 1);
}

/** Rows to render for a virtualised list of `count` rows of `rowHeight` px: the first index
 * and how many, with `overscan` rows either side. */
export function visibleRange(
  scrollTop: number,
  viewport: number,
  rowHeight: number,
  count: number,
  overscan = 8,
): { start: number; end: number } {
  const first = Math.floor(Math.max(0, scrollTop) / rowHeight);
  const start = Math.max(0, first - overscan);
  const end = Math.min(count, first + Math.ceil(viewport / rowHeight) + overscan);
  return { start, end: Math.max(start, end) };
}
