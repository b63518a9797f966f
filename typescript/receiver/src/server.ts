/**
 * The receiver on Node's own http server (no framework): `POST {prefix}` and
 * `POST {prefix}/{route}` receive, `GET {prefix}/lookup/{key}` serves the lookup contract.
 * A body is read only up to `maxBodyBytes` (413 past it, declared or as it streams in, and
 * the connection is closed); a request head must arrive within `headerTimeoutS`.
 * `handleRequest` is the same routing as a request listener for an existing server.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { HEADER_TIMEOUT_S, MAX_BODY_BYTES, type Reply, type WebhookReceiver } from "./kit.js";

export interface ServerOptions {
  /** Where the routes live (default `/hooks`). */
  prefix?: string;
  maxBodyBytes?: number;
  headerTimeoutS?: number;
}

/** A request listener serving the receiver's routes; anything else is 404. */
export function handleRequest(
  receiver: WebhookReceiver,
  options: ServerOptions = {},
): (request: IncomingMessage, response: ServerResponse) => void {
  const prefix = (options.prefix ?? "/hooks").replace(/\/+$/, "");
  const limit = options.maxBodyBytes ?? MAX_BODY_BYTES;
  return (request, response) => {
    void route(receiver, prefix, limit, request, response).catch((error: unknown) => {
      console.error(`receiver: ${request.method} ${request.url} failed:`, error);
      write(response, { status: 500, body: { error: "internal error in the receiver" } });
    });
  };
}

/** An http.Server serving the receiver; `listen` it, and `close` the receiver after it. */
export function createReceiverServer(receiver: WebhookReceiver, options: ServerOptions = {}): Server {
  const server = createServer(handleRequest(receiver, options));
  server.headersTimeout = (options.headerTimeoutS ?? HEADER_TIMEOUT_S) * 1000;
  server.requestTimeout = 60_000;
  server.keepAliveTimeout = (options.headerTimeoutS ?? HEADER_TIMEOUT_S) * 1000;
  return server;
}

async function route(
  receiver: WebhookReceiver,
  prefix: string,
  limit: number,
  request: IncomingMessage,
  response: ServerResponse,
): Promise<void> {
  const path = new URL(request.url ?? "/", "http://receiver").pathname;
  const lookup = `${prefix}/lookup/`;
  if (request.method === "GET" && path.startsWith(lookup) && path.length > lookup.length) {
    request.resume();
    let key: string;
    try {
      key = decodeURIComponent(path.slice(lookup.length));
    } catch {
      write(response, { status: 400, body: { error: "the key in the lookup path is not valid percent-encoding" } });
      return;
    }
    write(response, await receiver.lookup(key, request.headers));
    return;
  }
  if (path === (prefix || "/") || path.startsWith(`${prefix}/`)) {
    if (request.method !== "POST") {
      request.resume();
      write(response, { status: 405, body: { error: `${request.method} is not allowed here; POST a webhook` }, headers: { allow: "POST" } });
      return;
    }
    const body = await boundedBody(request, limit);
    if (body === undefined) {
      write(response, { status: 413, body: { error: `the body is larger than ${limit} bytes` }, headers: { connection: "close" } });
      return;
    }
    write(response, await receiver.receive(request.headers, body, path.slice(prefix.length)));
    return;
  }
  request.resume();
  write(response, { status: 404, body: { error: `no route ${path}` } });
}

/** The body, or undefined as soon as it is known to be over `limit` bytes. */
async function boundedBody(request: IncomingMessage, limit: number): Promise<Buffer | undefined> {
  const declared = request.headers["content-length"];
  if (declared !== undefined && /^[0-9]+$/.test(declared) && Number(declared) > limit) return undefined;
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of request) {
    size += (chunk as Buffer).length;
    if (size > limit) return undefined;
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

function write(response: ServerResponse, reply: Reply): void {
  if (response.headersSent) return;
  const text = JSON.stringify(reply.body);
  response.writeHead(reply.status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(text),
    ...reply.headers,
  });
  response.end(text);
}
