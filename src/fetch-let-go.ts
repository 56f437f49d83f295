/**
 * `fetch` for the exchanges the library makes itself (the proxy's upstream, the OAuth
 * validator's authorization server), letting go of the connection where Node's `fetch` keeps it.
 * @module
 */

/**
 * Calls `fetchImpl` under `controller`'s signal, and aborts `controller` where Node's `fetch`
 * would otherwise leave a socket open, paused, for good:
 * - it fails (a 407 is the Fetch standard's network error, and the response it failed on is
 *   neither read nor closed);
 * - it gives no body for the status (205, 304), leaving what the server sent with it unread.
 * Aborting a finished exchange changes nothing else: the caller tells a timeout by a flag of its
 * own, not by `controller.signal.aborted`.
 * @internal
 */
export async function fetchLettingGo<Input>(
  fetchImpl: (input: Input, init: RequestInit) => Promise<Response>,
  input: Input,
  init: RequestInit,
  controller: AbortController,
): Promise<Response> {
  let response: Response
  try {
    response = await fetchImpl(input, { ...init, signal: controller.signal })
  } catch (error) {
    controller.abort()
    throw error
  }
  if (response.body === null) controller.abort()
  return response
}
