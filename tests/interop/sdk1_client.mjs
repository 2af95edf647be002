// An earlier-era client: @modelcontextprotocol/sdk 1.x over Streamable HTTP, with the
// `initialize` handshake and no Tasks extension, so task tools answer synchronously.
//
//   node sdk1_client.mjs URL SCENARIO
//
// Prints one JSON line: what it observed. Scenarios: progress, elicit, abort.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const [url, scenario] = process.argv.slice(2);
const errors = [];

async function connect() {
  const client = new Client({ name: "celery-mcp-tasks-interop-sdk1", version: "1.0.0" }, { capabilities: { elicitation: {} } });
  client.onerror = (error) => errors.push(String(error?.message ?? error));
  const transport = new StreamableHTTPClientTransport(new URL(url));
  await client.connect(transport);
  return { client, transport };
}

function textOf(result) {
  return result?.content?.find((block) => block.type === "text")?.text;
}

function failure(error) {
  return { name: error?.name ?? null, code: error?.code ?? null, message: String(error?.message ?? error) };
}

const scenarios = {
  /** A synchronous call with onprogress: notifications/progress arrive while it waits. */
  async progress() {
    const { client, transport } = await connect();
    const progress = []; // the SDK calls onprogress only while the request is still waiting
    const report = { protocol: transport.protocolVersion ?? null };
    try {
      const result = await client.callTool({ name: "count_up", arguments: { steps: 4, pause: 0.5 } }, undefined, {
        onprogress: (p) => progress.push(p),
        timeout: 60_000,
      });
      Object.assign(report, { text: textOf(result), isError: result.isError === true });
    } catch (error) {
      Object.assign(report, { failed: failure(error) });
    }
    await client.close();
    return { ...report, progress };
  },

  /** A synchronous call to a job that asks a question: the elicitation handler answers it. */
  async elicit() {
    const { client } = await connect();
    const asked = [];
    client.setRequestHandler(ElicitRequestSchema, async (request) => {
      asked.push({ message: request.params.message, fields: Object.keys(request.params.requestedSchema?.properties ?? {}) });
      return { action: "accept", content: { name: "Grace" } };
    });
    const report = {};
    try {
      const result = await client.callTool({ name: "ask_name", arguments: { greeting: "Hi" } }, undefined, { timeout: 60_000 });
      Object.assign(report, { text: textOf(result), isError: result.isError === true });
    } catch (error) {
      Object.assign(report, { failed: failure(error) });
    }
    await client.close();
    return { ...report, asked };
  },

  /** Abort a synchronous call mid-way (the SDK sends notifications/cancelled). */
  async abort() {
    const { client } = await connect();
    const controller = new AbortController();
    let progressed = 0;
    // Abort once the job reports it is running, or after 2 s if no progress reaches this client.
    const fallback = setTimeout(() => controller.abort("the caller gave up"), 2_000);
    const report = {};
    try {
      const result = await client.callTool({ name: "stay_busy", arguments: { seconds: 120 } }, undefined, {
        signal: controller.signal,
        timeout: 180_000,
        onprogress: () => {
          progressed += 1;
          controller.abort("the caller gave up");
        },
      });
      Object.assign(report, { text: textOf(result) });
    } catch (error) {
      Object.assign(report, { aborted: controller.signal.aborted, failed: failure(error) });
    }
    clearTimeout(fallback);
    // Let the cancellation notification leave before the session is closed.
    await new Promise((resolve) => setTimeout(resolve, 500));
    await client.close();
    return { ...report, progressed };
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
