/**
 * The platform of `app.ts` (the built package's Web adapter in front of the MCP SDK's
 * web-standard transport), served by Bun (`Bun.serve`) or Deno (`Deno.serve`): the runtime
 * `test/runtimes/web-runtimes.test.ts` runs it under. It prints one JSON line (`{ port }`) once
 * it listens, and serves until it is killed.
 */
import { createRuntimeApp, withTestHost } from './app.js'

// The built package, as users import it; typed by the source (tsconfig paths), which tsc can
// check before anything is built.
const dist = new URL('../../dist/', import.meta.url)
const lib = (await import(new URL('index.js', dist).href)) as typeof import('mcp-dispatch')
const web = (await import(new URL('adapters/web/index.js', dist).href)) as typeof import('mcp-dispatch/web')
const { serve } = createRuntimeApp(lib, web)

interface Runtimes {
  Bun?: {
    serve(options: {
      port: number
      hostname: string
      fetch(request: Request, server: { requestIP(request: Request): { address: string } | null }): Promise<Response>
    }): { port: number }
  }
  Deno?: {
    serve(
      options: { port: number; hostname: string; onListen(address: { port: number }): void },
      handler: (request: Request, info: { remoteAddr: { hostname: string } }) => Promise<Response>,
    ): unknown
  }
}
const runtime = globalThis as Runtimes
const announce = (port: number) => console.log(JSON.stringify({ port }))

if (runtime.Bun) {
  const server = runtime.Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    fetch: (request, bun) => serve(withTestHost(request), bun.requestIP(request)?.address),
  })
  announce(server.port)
} else if (runtime.Deno) {
  runtime.Deno.serve(
    { port: 0, hostname: '127.0.0.1', onListen: ({ port }) => announce(port) },
    (request, info) => serve(withTestHost(request), info.remoteAddr.hostname),
  )
} else {
  throw new Error('test/runtimes/server.ts runs under Bun or Deno')
}
