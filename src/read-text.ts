/**
 * A bounded read of a web body, shared by the token API (request bodies) and the OAuth
 * validator and the proxy's identity (authorization-server answers, JWKS).
 * @module
 */

/** Thrown by {@link readTextUpTo} with `strict` for a body that is not UTF-8. */
export class NotUtf8Error extends Error {}

/**
 * Thrown by {@link readRequestTextUpTo} when the client's connection ended before the whole body
 * did; `cause` is the error the body's stream failed with.
 * @internal
 */
export class BodyCutError extends Error {}

/**
 * The body of `message` as text, read only up to `maxBytes`: `null` once it is known to be
 * larger (a `Content-Length` over the limit, or more bytes than that arriving, chunked or
 * with a false length), the rest cancelled, never held whole in memory. Bytes that are not
 * UTF-8 become U+FFFD; with `strict`, they reject with {@link NotUtf8Error} instead.
 * @internal
 */
export async function readTextUpTo(message: Request | Response, maxBytes: number, strict = false): Promise<string | null> {
  if (Number(message.headers.get('content-length') ?? 0) > maxBytes) {
    void message.body?.cancel().catch(() => {})
    return null
  }
  if (!message.body) return ''
  const reader = message.body.getReader()
  const decoder = new TextDecoder('utf-8', { fatal: strict })
  let text = ''
  let size = 0
  for (;;) {
    const { done, value } = await reader.read()
    if (done) return text + decode(decoder)
    size += value.byteLength
    if (size > maxBytes) {
      reader.cancel().catch(() => {})
      return null
    }
    try {
      text += decode(decoder, value)
    } catch (error) {
      reader.cancel().catch(() => {})
      throw error
    }
  }
}

/**
 * {@link readTextUpTo} of a request's body, telling the client's doing from the server's: a body
 * whose stream failed as it came because the client's connection ended before the whole body did
 * (fewer bytes than its `Content-Length`, a chunked body without its last chunk) rejects with
 * {@link BodyCutError}. Any other failure rejects as it came: a body the platform's hooks read or
 * locked first, a platform's own stream in front of the reader (spooled or decoded) failing, a
 * body not UTF-8 ({@link NotUtf8Error}, with `strict`).
 * @internal
 */
export async function readRequestTextUpTo(request: Request, maxBytes: number, strict = false): Promise<string | null> {
  const spent = request.bodyUsed || request.body?.locked === true
  try {
    return await readTextUpTo(request, maxBytes, strict)
  } catch (error) {
    if (!(error instanceof NotUtf8Error) && !spent && cutByClient(error, request)) {
      throw new BodyCutError('The connection ended before the whole body arrived', { cause: error })
    }
    throw error
  }
}

/**
 * Node's codes of a request that ended early: the Node adapters' body stream, `@hono/node-server`'s
 * and Next.js's (`Error: aborted`, a premature close), an HTTP/2 stream the client reset.
 */
const CUT_CODES: ReadonlySet<unknown> = new Set(['ECONNRESET', 'ECONNABORTED', 'ERR_STREAM_PREMATURE_CLOSE', 'ERR_HTTP2_STREAM_ERROR'])
/** Deno's errors (classes of their name) of a connection that ended mid-body: half-closed (`BadResource`), reset (`Http`: unexpected EOF), and kin. */
const CUT_DENO_ERRORS: ReadonlySet<unknown> = new Set(['BadResource', 'Http', 'ConnectionReset', 'ConnectionAborted', 'UnexpectedEof'])

/**
 * Whether `error`, out of `request`'s body stream, is its runtime saying the client's connection
 * ended before the body did, as each runtime says it (measured: Node, Deno 2, workerd, Bun), or
 * the request's own signal saying the client left (Bun: an `AbortError`). Its signal is read last:
 * Deno warns on stderr when it is read, and its errors are known before.
 */
function cutByClient(error: unknown, request: Request): boolean {
  if (typeof error === 'object' && error !== null) {
    const { code, name, message } = error as { code?: unknown; name?: unknown; message?: unknown }
    if (CUT_CODES.has(code)) return true
    if (CUT_DENO_ERRORS.has(name) && (error as { constructor?: { name?: unknown } }).constructor?.name === name) return true
    // workerd's, for a half-closed connection and a reset one alike.
    if (message === 'Network connection lost.') return true
  }
  return request.signal?.aborted === true
}

/**
 * The text of `chunk`, or, without one, what `decoder` holds back at the end (a sequence cut
 * short is no UTF-8 either); a strict decoder's refusal as {@link NotUtf8Error}.
 */
function decode(decoder: TextDecoder, chunk?: Uint8Array): string {
  try {
    return chunk === undefined ? decoder.decode() : decoder.decode(chunk, { stream: true })
  } catch (error) {
    throw new NotUtf8Error('The body is not UTF-8', { cause: error })
  }
}

/**
 * The content codings a `Content-Encoding` value lists, in order, lower case and trimmed, empty
 * list entries kept as `''` (RFC 9110 section 8.4); none for an absent field.
 */
export function contentCodings(value: string | null): string[] {
  return value === null ? [] : value.split(',').map((coding) => coding.trim().toLowerCase())
}
