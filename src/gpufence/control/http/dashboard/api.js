// Talking to the control plane: every /v1 call carries the token as `Authorization: Bearer`.
// The token lives in this tab's sessionStorage only: never in a URL (so never in an access
// log, a Referer header or the history), and gone when the tab closes.

const KEY = "gpufence.token";

export class AuthError extends Error {}

export function token() {
  return sessionStorage.getItem(KEY);
}

export function setToken(value) {
  sessionStorage.setItem(KEY, value);
}

export function clearToken() {
  sessionStorage.removeItem(KEY);
  sessionStorage.removeItem(WHO);
}

// who the token is (/v1/dashboard/whoami), kept beside it: a reload draws its page at once
// and checks the token with the page's own calls (a 401 signs out)
const WHO = "gpufence.who";

export function cachedWho() {
  try {
    return JSON.parse(sessionStorage.getItem(WHO) ?? "null");
  } catch (_) {
    return null;
  }
}

function headers() {
  const t = token();
  return t ? { Authorization: `Bearer ${t}` } : {};
}

async function call(path, asText) {
  const resp = await fetch(path, { headers: headers(), cache: "no-store" });
  if (resp.status === 401) throw new AuthError("the token was not accepted");
  if (!resp.ok) {
    let detail = `${resp.status} ${resp.statusText}`;
    try {
      const body = await resp.json();
      if (typeof body.detail === "string") detail = body.detail;
      else if (Array.isArray(body.detail) && body.detail[0]?.msg) detail = body.detail[0].msg;
    } catch (_) { /* not JSON */ }
    const err = new Error(detail);
    err.status = resp.status;
    throw err;
  }
  return asText ? resp : resp.json();
}

export function get(path, params) {
  return call(withQuery(path, params), false);
}

export function getRaw(path, params) {
  return call(withQuery(path, params), true);
}

export function withQuery(path, params) {
  if (!params) return path;
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === null || v === undefined || v === "") continue;
    for (const one of Array.isArray(v) ? v : [v]) q.append(k, String(one));
  }
  const qs = q.toString();
  return qs ? `${path}?${qs}` : path;
}

// A sign-in check: who the token is, or AuthError. The token is kept only if it works.
export async function signIn(value) {
  const resp = await fetch("/v1/dashboard/whoami", {
    headers: { Authorization: `Bearer ${value}` }, cache: "no-store",
  });
  if (resp.status === 401) throw new AuthError("that token is not the admin's or a tenant's");
  if (!resp.ok) throw new Error(`${resp.status} ${resp.statusText}`);
  setToken(value);
  const who = await resp.json();
  sessionStorage.setItem(WHO, JSON.stringify(who));
  return who;
}
