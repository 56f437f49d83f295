/**
 * The platform of `token-api-audit-app.ts` (the source, src/, so a fix is what runs) served by
 * Bun (`Bun.serve`) or Deno (`Deno.serve`, with `--sloppy-imports`) on 127.0.0.1 at the port
 * given as its first argument, with `lastUsedFlushMs` its second. It prints `{ port }` once it
 * listens, and serves until it is killed.
 */
import * as lib from '../../src/index.js'
import * as web from '../../src/adapters/web/index.js'
import { withTestHost } from './app.js'
import { createAuditApp } from './token-api-audit-app.js'

interface Runtimes {
  Bun?: {
    serve(options: {
      port: number
      hostname: string
      fetch(request: Request, server: { requestIP(request: Request): { address: string } | null }): Promise<Response>
    }): { port: number }
  }
  Deno?: {
    args: string[]
    serve(
      options: { port: number; hostname: string; onListen(address: { port: number }): void },
      handler: (request: Request, info: { remoteAddr: { hostname: string } }) => Promise<Response>,
    ): unknown
  }
  process?: { argv: string[] }
}
const runtime = globalThis as Runtimes
const args = runtime.Deno ? runtime.Deno.args : runtime.process!.argv.slice(2)
const port = Number(args[0])
const { serve } = createAuditApp(lib, web, { lastUsedFlushMs: Number(args[1] ?? 60_000) })
const announce = (port: number) => console.log(JSON.stringify({ port }))

if (runtime.Bun) {
  const server = runtime.Bun.serve({
    port,
    hostname: '127.0.0.1',
    fetch: (request, bun) => serve(withTestHost(request), bun.requestIP(request)?.address),
  })
  announce(server.port)
} else if (runtime.Deno) {
  runtime.Deno.serve(
    { port, hostname: '127.0.0.1', onListen: ({ port }) => announce(port) },
    (request, info) => serve(withTestHost(request), info.remoteAddr.hostname),
  )
} else {
  throw new Error('test/runtimes/token-api-audit-server.ts runs under Bun or Deno')
}
