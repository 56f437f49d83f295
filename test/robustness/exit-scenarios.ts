/**
 * Run by `exits-on-its-own.test.ts` in a process of its own (`node --import tsx`): the faults of
 * the fault-injection suite on every adapter, on real timers and sockets (a store that hangs or
 * throws, a handler that throws, a client that goes away mid-stream, an authorization server
 * that is down), then every server, agent and fixture closed, and nothing else. It prints what
 * each adapter answered as one line of JSON and never calls `process.exit`: the process ends
 * only if nothing of the library is left holding it (a timer, a socket, a server).
 */
import * as http from 'node:http'
import { createOAuthValidator } from 'mcp-dispatch'
import { freePort } from '../helpers/free-port.js'
import { TOOLS_LIST, adapterTargets, createFixture, mcpHeaders, send, settles } from './support.js'

/**
 * Opens an SSE stream, reads its first event, and goes away; the event read. With `session`,
 * the stream opens that session: pinned, and kept alive by the dispatcher's interval while open.
 */
function leaveMidStream(port: number, token: string, session?: string): Promise<string> {
  const headers = mcpHeaders(port, token, { 'x-robustness-sse': '1', ...(session && { 'x-robustness-session': session }) })
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: '127.0.0.1', port, method: 'POST', path: '/v1', agent: false, headers },
      (res) => {
        res.on('error', () => {}) // "aborted": we are the ones going away
        res.once('data', (chunk: Buffer) => {
          resolve(`${res.statusCode} ${chunk.toString().trim()}`)
          req.destroy()
        })
      },
    )
    req.on('error', (error) => (error.message === 'socket hang up' ? undefined : reject(error)))
    req.end(TOOLS_LIST)
  })
}

const down = `http://127.0.0.1:${await freePort()}`
const results: Record<string, unknown[]> = {}
for (const target of await adapterTargets()) {
  const oauth = createOAuthValidator({
    issuer: down,
    userinfoEndpoint: `${down}/userinfo`,
    timeoutMs: 500,
    retry: { attempts: 2, baseDelayMs: 5, deadlineMs: 2_000 },
  })
  const fixture = await createFixture({ faults: true, oauth, dispatcher: { storeTimeoutMs: 200 } })
  const running = await target.start({ dispatcher: fixture.dispatcher, onError: fixture.onError })
  const agent = new http.Agent({ keepAlive: true })
  const call = async (token: string, extra: Record<string, string> = {}) =>
    (await send(running.port, { method: 'POST', path: '/v1', headers: mcpHeaders(running.port, token, extra), body: TOOLS_LIST }, agent)).status
  const answers: unknown[] = [await call(fixture.tokens.valid)]
  for (const fault of ['hang', 'throw', 'reject'] as const) {
    fixture.faults.modes.subscriptions = fault
    answers.push(await call(fixture.tokens.valid))
  }
  fixture.faults.modes.subscriptions = 'ok'
  // The hung calls answer late, as a store that recovers does: their answers go nowhere.
  fixture.faults.release()
  answers.push(await call(fixture.tokens.valid, { 'x-robustness-throw': '1' }))
  answers.push(await call('an-oauth-access-token'))
  answers.push(await leaveMidStream(running.port, fixture.tokens.valid))
  answers.push(await settles(() => running.state.streamsClosed === 1 && running.state.streamsOpen === 0))
  answers.push(await leaveMidStream(running.port, fixture.tokens.valid, `exit-${target.name}`))
  answers.push(await settles(() => running.state.streamsClosed === 2 && running.state.streamsOpen === 0))
  answers.push(await call(fixture.tokens.valid))
  agent.destroy()
  await running.close()
  await fixture.close()
  results[target.name] = answers
}
console.log(JSON.stringify(results))
// What still holds the process, should anything: printed by a timer that does not hold it.
setTimeout(() => console.error(`still running, held by: ${process.getActiveResourcesInfo().join(', ')}`), 5_000).unref()
