/**
 * `new URL(input, base)`, or `undefined` where the URL parser refuses it.
 *
 * Every check in this package of whether a string is a URL goes through here, never through
 * `URL.canParse`: Node 20's `URL.canParse`, once V8 has optimised a call site (after some
 * thousands of calls), answers `false` for any string holding a Latin-1 character that is not
 * ASCII (`https://bücher.example`, `https://é`), which `new URL` parses. The same audience, issuer
 * or Origin would be accepted on the first requests of a process and refused later. Node 22
 * answers correctly; the lint config forbids `URL.canParse` everywhere in the repository.
 * @internal
 */
export function parseUrl(input: string, base?: string): URL | undefined {
  try {
    return new URL(input, base)
  } catch {
    return undefined
  }
}
