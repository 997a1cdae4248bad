// A real @a2a-js/sdk peer against the Agora hub: blocking send, streaming send, unknown task.
// Usage: node peer.mjs BASE_URL TOKEN WORKSPACE   (prints one JSON object on stdout)
import { randomUUID } from "node:crypto";
import { ClientFactory, ClientFactoryOptions, JsonRpcTransportFactory } from "@a2a-js/sdk/client";
import { TaskNotFoundError } from "@a2a-js/sdk/errors";

const [baseUrl, token, workspace] = process.argv.slice(2);
const authFetch = (input, init = {}) => {
  const headers = new Headers(init.headers ?? {});
  headers.set("Authorization", `Bearer ${token}`);
  return fetch(input, { ...init, headers });
};
const factory = new ClientFactory(
  ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
    transports: [new JsonRpcTransportFactory({ fetchImpl: authFetch })],
  }),
);
const client = await factory.createFromUrl(baseUrl);

const message = (text) => ({
  messageId: randomUUID(),
  contextId: workspace,
  taskId: "",
  role: 1, // ROLE_USER
  parts: [{ content: { $case: "text", value: text }, metadata: undefined, filename: "", mediaType: "" }],
  metadata: undefined,
  extensions: [],
  referenceTaskIds: [],
});

const out = { protocolVersion: client.protocolVersion };

const sent = await client.sendMessage({ tenant: "", message: message("from node"), metadata: undefined });
const task = sent.payload?.$case === "task" ? sent.payload.value : sent;
out.blocking = {
  state: task.status?.state,
  contextId: task.contextId,
  artifacts: (task.artifacts ?? []).flatMap((a) => a.parts.map((p) => p.content?.value)),
};

out.stream = [];
for await (const event of client.sendMessageStream({ tenant: "", message: message("streamed"), metadata: undefined })) {
  const c = event.payload?.$case;
  const v = event.payload?.value;
  out.stream.push(c === "task" || c === "statusUpdate" ? `${c}:${v.status?.state}` : c);
}

const fetched = await client.getTask({ tenant: "", id: task.id, historyLength: undefined });
out.getTask = { id: fetched.id, state: fetched.status?.state };

try {
  await client.getTask({ tenant: "", id: "no-such-task", historyLength: undefined });
  out.unknown = "no error";
} catch (err) {
  out.unknown = {
    name: err?.constructor?.name,
    isTaskNotFound: err instanceof TaskNotFoundError,
    code: err?.code ?? null,
    message: String(err?.message ?? err),
  };
}
console.log(JSON.stringify(out));
