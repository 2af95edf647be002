// A 2026-07-28 client with the Tasks extension, built from the official packages:
// @modelcontextprotocol/client (connects, negotiates the era, opens subscriptions/listen)
// and @modelcontextprotocol/ext-tasks (calls task tools, follows, answers input, cancels).
//
//   node ext_tasks_client.mjs URL SCENARIO
//
// Prints one JSON line: what it observed. Scenarios: follow, listen, input, cancel.
//
// The one piece of wiring ext-tasks leaves to its host is `rawDispatch`: the SDK
// Client's codecs refuse `resultType: "task"`, so the package sends tools/call and
// tasks/* through a host-owned request path on the same transport (as the MCP
// Inspector does). `RawRequests` is that path: it sends the package's framed
// request and hands back the matching response, nothing more.

import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import {
  DispatchError,
  createApplicationInputHandler,
  createTaskSessionEndpointId,
  createTaskSessionFromClient,
} from "@modelcontextprotocol/ext-tasks/client";

const [url, scenario] = process.argv.slice(2);
const RAW_ID_PREFIX = "interop-raw-";
const TERMINAL = new Set(["completed", "failed", "cancelled"]);

/** The host request coordinator ext-tasks needs for V2 task traffic. */
class RawRequests {
  pending = new Map();
  counter = 0;

  constructor(transport) {
    this.transport = transport;
  }

  dispatch = (request, options = {}) => {
    const id = `${RAW_ID_PREFIX}${(this.counter += 1)}`;
    const message = { jsonrpc: "2.0", id, method: request.method };
    if (request.params !== undefined) message.params = request.params;
    const { signal } = options;
    return new Promise((resolve, reject) => {
      const wire = new AbortController();
      const onAbort = () => {
        this.pending.delete(id);
        wire.abort(signal.reason);
        reject(new DispatchError(`${request.method} aborted`, false, { cause: signal.reason }));
      };
      if (signal?.aborted) return onAbort();
      signal?.addEventListener("abort", onAbort, { once: true });
      this.pending.set(id, (response) => {
        signal?.removeEventListener("abort", onAbort);
        resolve(response);
      });
      const headers = options.context?.headers;
      this.transport
        .send(message, { requestSignal: wire.signal, ...(headers === undefined ? {} : { headers }) })
        .catch((error) => {
          if (!this.pending.delete(id)) return;
          signal?.removeEventListener("abort", onAbort);
          reject(new DispatchError(`${request.method} failed to send`, true, { cause: error }));
        });
    });
  };

  /** True when `message` answers a raw request (it then never reaches the SDK Client). */
  consume(message) {
    if (typeof message?.id !== "string" || !message.id.startsWith(RAW_ID_PREFIX)) return false;
    const settle = this.pending.get(message.id);
    this.pending.delete(message.id);
    if (settle === undefined) return true;
    if ("error" in message) {
      const { code, message: text, data } = message.error;
      settle({ kind: "error", error: { code, message: text, ...(data === undefined ? {} : { data }) } });
    } else {
      settle({ kind: "result", result: message.result });
    }
    return true;
  }
}

/** The Streamable HTTP transport, with raw responses routed to `RawRequests` and traffic counted. */
class CoordinatedTransport {
  onmessage = undefined;
  onclose = undefined;
  onerror = undefined;

  constructor(inner) {
    this.inner = inner;
    this.raw = new RawRequests(this);
    this.sent = {}; // method -> count
    this.taskNotifications = []; // statuses of notifications/tasks, in arrival order
    this.acknowledged = []; // the task ids of each subscriptions/listen acknowledgement
    inner.onmessage = (message, extra) => {
      if (message?.method === "notifications/tasks") this.taskNotifications.push(message.params?.status);
      if (message?.method === "notifications/subscriptions/acknowledged") {
        // Read off the wire: the Client's own honoredFilter keeps only the core filter fields.
        this.acknowledged.push(message.params?.notifications?.taskIds ?? []);
      }
      if (this.raw.consume(message)) return;
      this.onmessage?.(message, extra);
    };
    inner.onclose = () => this.onclose?.();
    inner.onerror = (error) => this.onerror?.(error);
  }

  get hasPerRequestStream() {
    return this.inner.hasPerRequestStream;
  }
  get sessionId() {
    return this.inner.sessionId;
  }
  start() {
    return this.inner.start();
  }
  send(message, options) {
    if (typeof message?.method === "string" && "id" in message) {
      this.sent[message.method] = (this.sent[message.method] ?? 0) + 1;
    }
    return this.inner.send(message, options);
  }
  close() {
    return this.inner.close();
  }
  setProtocolVersion(version) {
    this.inner.setProtocolVersion?.(version);
  }
  setSupportedProtocolVersions(versions) {
    this.inner.setSupportedProtocolVersions?.(versions);
  }
}

const clientInfo = { name: "celery-mcp-tasks-interop", version: "1.0.0" };
const capabilities = { elicitation: { form: {} }, extensions: { "io.modelcontextprotocol/tasks": {} } };

async function connect(onInputRequest) {
  const transport = new CoordinatedTransport(new StreamableHTTPClientTransport(new URL(url)));
  const client = new Client(clientInfo, {
    capabilities,
    versionNegotiation: { mode: { pin: "2026-07-28" } },
  });
  await client.connect(transport);
  const session = createTaskSessionFromClient(client, {
    endpointId: await createTaskSessionEndpointId("celery-mcp-tasks-interop", { url }),
    rawDispatch: transport.raw.dispatch,
    v2RequestFraming: {
      protocolVersion: client.getNegotiatedProtocolVersion(),
      clientInfo,
      clientCapabilities: capabilities,
    },
    tools: { currentTool: () => undefined },
    ...(onInputRequest === undefined ? {} : { onInputRequest }),
    onError: (error) => errors.push(String(error?.message ?? error)),
  });
  return { client, transport, session };
}

const errors = [];

function textOf(result) {
  return result?.content?.find((block) => block.type === "text")?.text;
}

/** Settles an execution, recording each task snapshot the package reports. */
async function settle(execution) {
  const seen = [];
  const { outcome } = await execution.settle({
    onEvent(event) {
      if (event.type === "task") seen.push({ status: event.task.status, message: event.task.statusMessage ?? null });
    },
  });
  return { outcome, seen };
}

function describe(outcome) {
  return {
    status: outcome.status,
    text: outcome.status === "completed" ? textOf(outcome.result) : null,
    isError: outcome.status === "completed" ? outcome.result?.isError === true : null,
    error: outcome.status === "failed" ? outcome.error.message : null,
  };
}

const scenarios = {
  /** Call a task tool and follow it to its result (the package polls tasks/get). */
  async follow() {
    const { client, transport, session } = await connect();
    const execution = await session.callTool("count_up", { steps: 3, pause: 0.3 });
    const { outcome, seen } = await settle(execution);
    const report = {
      era: client.getProtocolEra(),
      protocol: client.getNegotiatedProtocolVersion(),
      kind: execution.kind,
      outcome: describe(outcome),
      seen,
      sent: transport.sent,
    };
    await session.close();
    await client.close();
    return report;
  },

  /** Follow a task whose poll interval is ten minutes: notifications/tasks on subscriptions/listen carry it. */
  async listen() {
    const { client, transport, session } = await connect();
    const execution = await session.callTool("count_up_pushed", { steps: 3, pause: 0.3 });
    const subscription = await client.listen({ taskIds: [execution.handle.taskId] });
    const honored = transport.acknowledged.some((ids) => ids.includes(execution.handle.taskId));
    const { outcome, seen } = await settle(execution);
    const report = {
      kind: execution.kind,
      honored,
      outcome: describe(outcome),
      seen,
      notified: transport.taskNotifications,
      sent: transport.sent,
    };
    await subscription.close();
    await session.close();
    await client.close();
    return report;
  },

  /** A task that asked before the client listened, whose poll hint is ten minutes: the question reaches the
   * package on the listen stream all the same (the stream starts with each task's state as it stands). */
  async listenAfterAsked() {
    const asked = [];
    const onInputRequest = createApplicationInputHandler({
      elicitation: async (request) => {
        asked.push(request.params.message);
        return { action: "accept", content: { name: "Lin" } };
      },
      sampling: async () => {
        throw new Error("no sampling in this scenario");
      },
      roots: async () => ({ roots: [] }),
    });
    const { client, transport, session } = await connect(onInputRequest);
    const execution = await session.callTool("ask_name_pushed", { greeting: "Hi" });
    const taskId = execution.handle.taskId;
    let reads = 0; // our own reads until the job has asked: then listen
    for (let status = "working"; status === "working" && reads < 300; reads += 1) {
      if (reads > 0) await new Promise((resolve) => setTimeout(resolve, 100));
      ({ status } = await session.task(taskId).snapshot());
    }
    const subscription = await client.listen({ taskIds: [taskId] });
    const { outcome, seen } = await settle(execution);
    const report = { kind: execution.kind, asked, reads, outcome: describe(outcome), seen, sent: transport.sent };
    await subscription.close();
    await session.close();
    await client.close();
    return report;
  },

  /** A task that asks for a name: the package's input handler answers it with tasks/update. */
  async input() {
    const asked = [];
    const onInputRequest = createApplicationInputHandler({
      elicitation: async (request, context) => {
        asked.push({ message: request.params.message, scope: context.scope, delivery: context.delivery });
        return { action: "accept", content: { name: "Ada" } };
      },
      sampling: async () => {
        throw new Error("no sampling in this scenario");
      },
      roots: async () => ({ roots: [] }),
    });
    const { client, transport, session } = await connect(onInputRequest);
    const execution = await session.callTool("ask_name", { greeting: "Hello" });
    const { outcome, seen } = await settle(execution);
    const report = { kind: execution.kind, asked, outcome: describe(outcome), seen, sent: transport.sent };
    await session.close();
    await client.close();
    return report;
  },

  /** Cancel a running task through the package (tasks/cancel), then read it back (tasks/get). */
  async cancel() {
    const { client, transport, session } = await connect();
    const execution = await session.callTool("stay_busy", { seconds: 120 });
    const taskId = execution.handle.taskId;
    const seen = [];
    for await (const event of execution.updates()) {
      if (event.type !== "task") break;
      seen.push(event.task.status);
      if (event.task.statusMessage === "busy") break; // the job is running
    }
    await execution.cancel();
    const snapshot = await session.task(taskId).snapshot();
    const report = {
      kind: execution.kind,
      seen,
      after: { status: snapshot.status, message: snapshot.statusMessage ?? null },
      sent: transport.sent,
    };
    await session.close();
    await client.close();
    return report;
  },
};

async function main() {
  const run = scenarios[scenario];
  if (run === undefined) throw new Error(`unknown scenario ${scenario}`);
  const report = await run();
  process.stdout.write(`${JSON.stringify({ scenario, ok: true, ...report, errors })}\n`);
}

main().then(
  () => process.exit(0),
  (error) => {
    process.stdout.write(`${JSON.stringify({ scenario, ok: false, error: String(error?.stack ?? error), errors })}\n`);
    process.exit(1);
  },
);
