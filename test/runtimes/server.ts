/**
 * The platform of `app.ts` (the built package's Web adapter in front of the MCP SDK's
 * web-standard transport), served by Bun (`Bun.serve`) or Deno (`Deno.serve`): the runtime
 * `test/runtimes/web-runtimes.test.ts` runs it under. It prints one JSON line (`{ port }`) once
 * it listens, and serves until it is killed (`test/helpers/runtime-serve.ts`).
 */
import { serveOnRuntime } from '../helpers/runtime-serve.js'
import { createRuntimeApp, withTestHost } from './app.js'

// The built package, as users import it; typed by the source (tsconfig paths), which tsc can
// check before anything is built.
const dist = new URL('../../dist/', import.meta.url)
const lib = (await import(new URL('index.js', dist).href)) as typeof import('mcp-dispatch')
const web = (await import(new URL('adapters/web/index.js', dist).href)) as typeof import('mcp-dispatch/web')
const { serve } = createRuntimeApp(lib, web)

serveOnRuntime('test/runtimes/server.ts', (request, clientAddress) => serve(withTestHost(request), clientAddress))
