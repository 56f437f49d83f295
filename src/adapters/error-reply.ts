/**
 * The JSON-RPC answer to an error that reached a Node framework's error handling (Express's
 * error middleware, Fastify's error handler): a body its JSON parser refused, or a route that
 * failed. Shared by `jsonRpcErrors` of the Express and Fastify adapters.
 * @internal
 */
import { optionNames, refuseUnknownOptions, reporterOption, ConfigurationError } from '../errors.js'
import { RpcCode, jsonRpcErrorReply, type Reply } from '../core/reply.js'
import { INTERNAL_ERROR } from './shared.js'

/** Options of `jsonRpcErrors` (Express, Fastify). */
export interface JsonRpcErrorsOptions {
  /**
   * Told of every error answered 500 (one without a client status: a route that threw, a
   * parser that failed on the server's side), with context `error handler`; default
   * `logError`. Errors with a client status (4xx) are the request's, not reported.
   */
  onError?: ((error: unknown, context: string) => void) | undefined
}

const OPTIONS = optionNames<JsonRpcErrorsOptions>({ onError: true })

/** @internal Checks `jsonRpcErrors`'s options; returns its reporter. */
export function setupJsonRpcErrors(options: JsonRpcErrorsOptions | undefined): (error: unknown, context: string) => void {
  if (options != null) {
    if (typeof options !== 'object') throw new ConfigurationError('options', 'must be an object')
    refuseUnknownOptions(options, OPTIONS, 'jsonRpcErrors')
  }
  return reporterOption(options?.onError)
}

/** What `errorReply` reads of an error: each property read once, none of them trusted. */
interface ErrorFacts {
  status: number | undefined
  /** Express's body-parser `type`, Fastify's `code`. */
  kind: unknown
  /** body-parser's `limit` of a 413. */
  limit: unknown
  syntax: boolean
}

function factsOf(error: unknown): ErrorFacts {
  if (typeof error !== 'object' || error === null) return { status: undefined, kind: undefined, limit: undefined, syntax: false }
  try {
    const e = error as { status?: unknown; statusCode?: unknown; type?: unknown; code?: unknown; limit?: unknown }
    const given = e.statusCode ?? e.status
    const status = Number.isInteger(given) && (given as number) >= 400 && (given as number) <= 599 ? (given as number) : undefined
    return { status, kind: e.type ?? e.code, limit: e.limit, syntax: error instanceof SyntaxError }
  } catch {
    // A proxy or a getter that throws: an error of the server's, with nothing more to read.
    return { status: undefined, kind: undefined, limit: undefined, syntax: false }
  }
}

const PARSE_ERROR = jsonRpcErrorReply(400, { code: RpcCode.ParseError, message: 'Parse error: Invalid JSON' })
/** The SDK transport's answer to a body that is JSON but no JSON-RPC message (`42`, `null`). */
const NOT_JSON_RPC = jsonRpcErrorReply(400, { code: RpcCode.ParseError, message: 'Parse error: Invalid JSON-RPC message' })
const UNSUPPORTED = jsonRpcErrorReply(415, { code: RpcCode.ServerError, message: 'Unsupported Media Type: Content-Type must be application/json' })
/** A rate limiter's refusal (`@fastify/rate-limit`'s): the code and message of the dispatcher's own 429. */
const RATE_LIMITED = jsonRpcErrorReply(429, { code: RpcCode.RateLimited, message: 'Rate limit exceeded' })

/** Kinds of error that say the body is not JSON (body-parser's, Fastify's). */
const NOT_JSON = new Set<unknown>(['entity.parse.failed', 'FST_ERR_CTP_INVALID_JSON_BODY', 'FST_ERR_CTP_EMPTY_JSON_BODY'])

/**
 * @internal The answer to `error`, in the words of the MCP SDK transport (which reads the body
 * itself where no framework parser runs): a body that is not JSON (body-parser's
 * `entity.parse.failed`, Fastify's invalid or empty JSON body, a `SyntaxError` with status 400)
 * 400 -32700 `Parse error: Invalid JSON`, one that body-parser's strict mode refused though it
 * is JSON (`42`) 400 -32700 `Parse error: Invalid JSON-RPC message`; past the limit 413 -32000
 * naming `limit` (the framework's, in bytes) when known; 415 as the SDK's; 429 (a rate limiter
 * in front) -32000 `Rate limit exceeded`, as the dispatcher's own says; another client error
 * (4xx) its own status with -32600 `Invalid Request`; anything else, the server's fault,
 * 500 -32603 (`serverFault`). The error's own text is never sent: a parser's message quotes
 * the body, a route's may name anything.
 */
export function errorReply(error: unknown, routeLimit?: unknown): { reply: Reply; serverFault: boolean } {
  const { status, kind, limit, syntax } = factsOf(error)
  if (status === undefined || status >= 500) return { reply: INTERNAL_ERROR, serverFault: true }
  if (NOT_JSON.has(kind) || (syntax && status === 400)) {
    return { reply: kind === 'entity.parse.failed' && isJsonText(bodyOf(error)) ? NOT_JSON_RPC : PARSE_ERROR, serverFault: false }
  }
  if (status === 413) {
    const bytes = isLimit(limit) ? limit : isLimit(routeLimit) ? routeLimit : undefined
    const message = bytes === undefined ? 'Payload Too Large' : `Payload Too Large: Request body must not exceed ${bytes} bytes`
    return { reply: jsonRpcErrorReply(413, { code: RpcCode.ServerError, message }), serverFault: false }
  }
  if (status === 415) return { reply: UNSUPPORTED, serverFault: false }
  if (status === 429) return { reply: RATE_LIMITED, serverFault: false }
  return { reply: jsonRpcErrorReply(status, { code: RpcCode.InvalidRequest, message: 'Invalid Request' }), serverFault: false }
}

/**
 * The text body-parser failed to parse (`err.body`): under its strict mode (the default) JSON
 * that is no object or array (`42`, `"x"`, `null`) is refused too, where the SDK transport,
 * reading the body itself, parses it and answers that it is no JSON-RPC message.
 */
function bodyOf(error: unknown): unknown {
  try {
    return (error as { body?: unknown }).body
  } catch {
    return undefined
  }
}

function isJsonText(text: unknown): boolean {
  if (typeof text !== 'string') return false
  try {
    JSON.parse(text)
    return true
  } catch {
    return false
  }
}

function isLimit(value: unknown): value is number {
  return Number.isSafeInteger(value) && (value as number) >= 0
}
