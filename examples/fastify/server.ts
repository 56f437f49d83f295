/** `npx tsx examples/fastify/server.ts` (PORT, default 8802). */
import type { AddressInfo } from 'node:net'
import { createDemo, printUsage } from '../shared/demo.js'
import { createFastifyExample } from './app.js'

const demo = await createDemo()
const app = await createFastifyExample(demo)
await app.listen({ port: Number(process.env.PORT ?? 8802), host: '127.0.0.1' })
printUsage('Fastify', (app.server.address() as AddressInfo).port, demo.token)
const stop = () => void app.close().finally(() => process.exit(0))
process.on('SIGINT', stop)
process.on('SIGTERM', stop)
