import { describe, expect, it } from 'vitest'
import { NotUtf8Error, readTextUpTo } from './read-text.js'

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
