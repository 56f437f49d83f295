/** A loopback port nothing listens on: taken from the system, then given back. */
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'

/** A free port on 127.0.0.1 (for a server started elsewhere, or one that must refuse connections). */
export async function freePort(): Promise<number> {
  const server = http.createServer()
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as AddressInfo
  await new Promise((resolve) => server.close(resolve))
  return port
}
