/**
 * A bounded read of a web body, shared by the token API (request bodies) and the OAuth
 * validator (authorization-server answers).
 * @module
 */

/** Thrown by {@link readTextUpTo} with `strict` for a body that is not UTF-8. */
export class NotUtf8Error extends Error {}

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
