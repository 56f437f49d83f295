/**
 * What the test drives and reads beside the MCP traffic (`/control/<action>`):
 * - `GET state`: the tokens, what the App observed, and what Next.js gave this route handler
 *   (its `request.url` and headers);
 * - `POST deploy` `{ "version": "1.1.1" }`: deploys a version of weather;
 * - `POST release`: lets the tool `wait_for_release` answer.
 */
import { platform } from '../../../lib/platform'

export async function GET(request: Request): Promise<Response> {
  const { tokens, observed } = await platform
  return Response.json({
    tokens,
    observed,
    moduleEvaluations: (globalThis as { mcpTestModuleEvaluations?: number }).mcpTestModuleEvaluations,
    seen: { url: request.url, headers: Object.fromEntries(request.headers) },
  })
}

export async function POST(request: Request, { params }: { params: Promise<{ action: string }> }): Promise<Response> {
  const { apps, release } = await platform
  const { action } = await params
  if (action === 'release') {
    release()
    return Response.json({ released: true })
  }
  const { version } = (await request.json()) as { version: string }
  return Response.json({ live: apps.deploy('app_weather', version) })
}
