/** `npx tsx examples/fastify/server.ts` (PORT, default 8802). */
import type { AddressInfo } from 'node:net'
import { cannotListen, createDemo, examplePort, printUsage } from '../shared/demo.js'
import { createFastifyExample } from './app.js'

const port = examplePort(8802)
const demo = await createDemo()
const app = await createFastifyExample(demo)
await app.listen({ port, host: '127.0.0.1' }).catch((error: unknown) => cannotListen(port, error))
printUsage('Fastify', (app.server.address() as AddressInfo).port, demo.token)
const stop = () => void app.close().finally(() => process.exit(0))
process.on('SIGINT', stop)
process.on('SIGTERM', stop)
