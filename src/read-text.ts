/**
 * A bounded read of a web body, shared by the token API (request bodies) and the OAuth
 * validator (authorization-server answers).
 * @module
 */

/**
 * The body of `message` as text, read only up to `maxBytes`: `null` once it is known to be
 * larger (a `Content-Length` over the limit, or more bytes than that arriving, chunked or
 * with a false length), the rest cancelled, never held whole in memory.
 * @internal
 */
export async function readTextUpTo(message: Request | Response, maxBytes: number): Promise<string | null> {
  if (Number(message.headers.get('content-length') ?? 0) > maxBytes) {
    void message.body?.cancel().catch(() => {})
    return null
  }
  if (!message.body) return ''
  const reader = message.body.getReader()
  const decoder = new TextDecoder()
  let text = ''
  let size = 0
  for (;;) {
    const { done, value } = await reader.read()
    if (done) return text + decoder.decode()
    size += value.byteLength
    if (size > maxBytes) {
      reader.cancel().catch(() => {})
      return null
    }
    text += decoder.decode(value, { stream: true })
  }
}
