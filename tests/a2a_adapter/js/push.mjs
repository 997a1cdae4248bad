// @a2a-js/sdk against the Agora hub: open a task, create/get/list/delete push configs.
// Usage: node push.mjs BASE_URL TOKEN WORKSPACE BINDING HOOK_URL
//   BINDING: jsonrpc | rest | grpc. Prints one JSON object on stdout; the Python test then
//   moves the task on and checks what the webhook received.
import { randomUUID } from "node:crypto";
import {
  ClientFactory,
  ClientFactoryOptions,
  JsonRpcTransportFactory,
  RestTransportFactory,
} from "@a2a-js/sdk/client";

const [baseUrl, token, workspace, binding, hookUrl] = process.argv.slice(2);
// The token travels as a service parameter: an HTTP header, or gRPC call metadata.
const options = { serviceParameters: { authorization: `Bearer ${token}` } };

async function transport() {
  if (binding === "jsonrpc") return new JsonRpcTransportFactory();
  if (binding === "rest") return new RestTransportFactory();
  const { GrpcTransportFactory } = await import("@a2a-js/sdk/client/grpc");
  return new GrpcTransportFactory();
}

const factory = new ClientFactory(
  ClientFactoryOptions.createFrom(ClientFactoryOptions.default, { transports: [await transport()] }),
);
const client = await factory.createFromUrl(baseUrl);

const sent = await client.sendMessage(
  {
    tenant: "",
    message: {
      messageId: randomUUID(),
      contextId: workspace,
      taskId: "",
      role: 1, // ROLE_USER
      parts: [{ content: { $case: "text", value: `push over ${binding}` }, metadata: undefined, filename: "", mediaType: "" }],
      metadata: undefined,
      extensions: [],
      referenceTaskIds: [],
    },
    configuration: {
      acceptedOutputModes: [],
      taskPushNotificationConfig: undefined,
      historyLength: undefined,
      returnImmediately: true,
    },
    metadata: undefined,
  },
  options,
);
const task = sent.payload?.$case === "task" ? sent.payload.value : sent;

const config = (id) => ({
  tenant: "",
  id,
  taskId: task.id,
  url: hookUrl,
  token: `token-${binding}`,
  authentication: { scheme: "Bearer", credentials: `secret-${binding}` },
});
const created = await client.createTaskPushNotificationConfig(config("js-1"), options);
await client.createTaskPushNotificationConfig(config("js-2"), options);
const got = await client.getTaskPushNotificationConfig({ tenant: "", taskId: task.id, id: "js-1" }, options);
const listed = await client.listTaskPushNotificationConfig(
  { tenant: "", taskId: task.id, pageSize: 0, pageToken: "" },
  options,
);
await client.deleteTaskPushNotificationConfig({ tenant: "", taskId: task.id, id: "js-2" }, options);
const after = await client.listTaskPushNotificationConfig(
  { tenant: "", taskId: task.id, pageSize: 0, pageToken: "" },
  options,
);

console.log(
  JSON.stringify({
    taskId: task.id,
    state: task.status?.state,
    created: { id: created.id, taskId: created.taskId, url: created.url },
    got: got.id,
    listed: listed.configs.map((c) => c.id).sort(),
    afterDelete: after.configs.map((c) => c.id),
  }),
);
