import { describe, expect, it } from 'vitest'
import { BodyCutError, NotUtf8Error, contentCodings, readRequestTextUpTo, readTextUpTo } from './read-text.js'

/** A request whose body arrives in `chunks`, telling whether it was cancelled. */
function streamed(chunks: Uint8Array[]) {
  const state = { cancelled: false }
  let next = 0
  const body = new ReadableStream<Uint8Array>({
    pull(controller) {
      if (next < chunks.length) controller.enqueue(chunks[next++]!)
      else controller.close()
    },
    cancel() {
      state.cancelled = true
    },
  })
  return { request: new Request('http://a.example/', { method: 'POST', body, duplex: 'half' } as RequestInit), state }
}

const TEXT = '{"name":"Caf\u00e9 \u65e5\u672c \u{1F680}"}'
const BYTES = new TextEncoder().encode(TEXT)

describe('readTextUpTo', () => {
  it('decodes characters split across chunks at any byte, strict or not, and drops a BOM', async () => {
    for (let cut = 1; cut < BYTES.length; cut++) {
      for (const strict of [false, true]) {
        const { request } = streamed([BYTES.slice(0, cut), BYTES.slice(cut)])
        expect(await readTextUpTo(request, 1_000, strict), `cut at ${cut}`).toBe(TEXT)
      }
    }
    const oneByOne = streamed([0xef, 0xbb, 0xbf, ...BYTES].map((byte) => new Uint8Array([byte])))
    expect(await readTextUpTo(oneByOne.request, 1_000, true)).toBe(TEXT)
  })

  it('strict: bytes that are not UTF-8 reject with NotUtf8Error and cancel the rest of the body', async () => {
    const bad = [new Uint8Array([0x7b, 0xff]), new Uint8Array([0x7d]), new Uint8Array([0x20])]
    const { request, state } = streamed(bad)
    await expect(readTextUpTo(request, 1_000, true)).rejects.toBeInstanceOf(NotUtf8Error)
    expect(state.cancelled).toBe(true)
    // A sequence cut short at the end of the body, and an encoded surrogate half.
    for (const bytes of [[0x7b, 0xe2, 0x82], [0xed, 0xa0, 0x80]]) {
      await expect(readTextUpTo(streamed([new Uint8Array(bytes)]).request, 1_000, true)).rejects.toBeInstanceOf(NotUtf8Error)
    }
    // Not strict: U+FFFD in their place, as before.
    expect(await readTextUpTo(streamed(bad).request, 1_000)).toBe('{\uFFFD} ')
  })

  it('null once the body passes the limit, the rest cancelled', async () => {
    const { request, state } = streamed([BYTES, BYTES])
    expect(await readTextUpTo(request, BYTES.length + 1, true)).toBeNull()
    expect(state.cancelled).toBe(true)
  })
})

/** A request whose body sends `first`, then fails with `error`. */
function failing(error: unknown, init: RequestInit = {}, first: Uint8Array = BYTES.slice(0, 5)): Request {
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      controller.enqueue(first)
    },
    pull(controller) {
      controller.error(error)
    },
  })
  return new Request('http://a.example/', { method: 'POST', body, duplex: 'half', ...init } as RequestInit)
}

/** An error of Node's with `code`. */
const coded = (code: string) => Object.assign(new Error('aborted'), { code })

/** An error of a class named `name`, as Deno's are. */
function denoError(name: string): Error {
  const DenoError = { [name]: class extends Error {} }[name]!
  const error = new DenoError('connection closed before message completed')
  error.name = name
  return error
}

describe('readRequestTextUpTo', () => {
  it('reads as readTextUpTo does', async () => {
    for (const strict of [false, true]) expect(await readRequestTextUpTo(streamed([BYTES]).request, 1_000, strict)).toBe(TEXT)
    expect(await readRequestTextUpTo(streamed([BYTES, BYTES]).request, BYTES.length + 1)).toBeNull()
    expect(await readRequestTextUpTo(new Request('http://a.example/'), 10)).toBe('')
  })

  it("rejects with BodyCutError, the stream's error as its cause, when the runtime says the client's connection ended", async () => {
    const cuts = [
      // Node: its adapters, @hono/node-server, Next.js, an HTTP/2 stream reset.
      ...['ECONNRESET', 'ECONNABORTED', 'ERR_STREAM_PREMATURE_CLOSE', 'ERR_HTTP2_STREAM_ERROR'].map(coded),
      // Deno: errors of classes of their name.
      ...['BadResource', 'Http', 'ConnectionReset', 'ConnectionAborted', 'UnexpectedEof'].map(denoError),
      // workerd.
      new Error('Network connection lost.'),
    ]
    for (const cut of cuts) {
      for (const strict of [false, true]) {
        const rejected = await readRequestTextUpTo(failing(cut), 1_000, strict).then(
          () => undefined,
          (error: unknown) => error,
        )
        expect(rejected, String((cut as { code?: string }).code ?? cut.name)).toBeInstanceOf(BodyCutError)
        expect((rejected as Error).cause).toBe(cut)
      }
    }
  })

  it("rejects with BodyCutError for any failure once the request's signal says the client left (Bun)", async () => {
    const left = new AbortController()
    left.abort()
    const error = new DOMException('The operation was aborted.', 'AbortError')
    const rejected = await readRequestTextUpTo(failing(error, { signal: left.signal }), 1_000, true).catch((error: unknown) => error)
    expect(rejected).toBeInstanceOf(BodyCutError)
    expect((rejected as Error).cause).toBe(error)
  })

  it("rejects with any other failure as it came: the server's, not the client's", async () => {
    const others = [
      new Error('spooled body failed'),
      coded('ENOSPC'),
      // Named as Deno's, but not of its class.
      Object.assign(new Error('unexpected'), { name: 'Http' }),
      new Error('Network connection lost'),
      'a string',
    ]
    for (const other of others) await expect(readRequestTextUpTo(failing(other), 1_000, true)).rejects.toBe(other)
  })

  it("rejects as it came with a body read or locked before it, the client gone or not: the platform's to fix", async () => {
    for (const aborted of [false, true]) {
      const left = new AbortController()
      if (aborted) left.abort()
      const locked = failing(coded('ECONNRESET'), { signal: left.signal })
      locked.body!.getReader()
      const rejected = await readRequestTextUpTo(locked, 1_000, true).catch((error: unknown) => error)
      expect(rejected).toBeInstanceOf(TypeError)
      expect(rejected).not.toBeInstanceOf(BodyCutError)

      const used = new Request('http://a.example/', { method: 'POST', body: TEXT, signal: left.signal })
      await used.text()
      await expect(readRequestTextUpTo(used, 1_000, true)).rejects.not.toBeInstanceOf(BodyCutError)
    }
  })

  it('rejects with NotUtf8Error for a body not UTF-8 though the client left, and reads the signal last', async () => {
    /** A request that counts the reads of its signal (Deno warns on each). */
    class Watched extends Request {
      reads = 0
      override get signal(): AbortSignal {
        this.reads++
        return super.signal
      }
    }
    const left = new AbortController()
    left.abort()
    const bad = new Watched(failing(new Error('never'), { signal: left.signal }, new Uint8Array([0x7b, 0xff])))
    await expect(readRequestTextUpTo(bad, 1_000, true)).rejects.toBeInstanceOf(NotUtf8Error)
    expect(bad.reads).toBe(0)
    expect(bad.signal.aborted).toBe(true)

    const reset = new Watched(failing(coded('ECONNRESET')))
    await expect(readRequestTextUpTo(reset, 1_000, true)).rejects.toBeInstanceOf(BodyCutError)
    expect(reset.reads).toBe(0)
  })
})

describe('contentCodings', () => {
  it('lists the codings of a Content-Encoding value, lower case and trimmed, empty entries kept', () => {
    expect(contentCodings(null)).toEqual([])
    expect(contentCodings('')).toEqual([''])
    expect(contentCodings(' GZIP , identity,,br ')).toEqual(['gzip', 'identity', '', 'br'])
  })
})
