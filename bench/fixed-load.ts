/**
 * A fixed number of `tools/list` requests to one benchmark server, from this process: the
 * load of `bench:instructions` and `bench:profile`, which count work per request rather
 * than time a run (`npm run bench` uses `load.ts`, in a process of its own).
 */
import autocannon, { type Result } from 'autocannon'
import { BENCH_PATH, TOOLS_LIST_REQUEST } from './fixture.js'

/** Sends `amount` requests over `connections` keep-alive connections; resolves with autocannon's result. */
export function loadFixed(port: number, token: string, hostname: string, amount: number, connections: number): Promise<Result> {
  return autocannon({
    url: `http://127.0.0.1:${port}${BENCH_PATH}`,
    connections,
    amount,
    timeout: 120,
    method: 'POST',
    headers: {
      host: `${hostname}:${port}`,
      authorization: `Bearer ${token}`,
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
    },
    body: TOOLS_LIST_REQUEST,
  })
}
