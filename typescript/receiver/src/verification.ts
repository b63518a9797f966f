/**
 * Standard Webhooks verification by the official `standardwebhooks` package, with several
 * secrets at once (rotation): a request is authentic when any `v1,` signature in
 * `webhook-signature` matches any of our secrets. Freshness is checked here first, so the
 * tolerance can be narrower than the library's own five minutes.
 */
import { Webhook, WebhookVerificationError } from "standardwebhooks";
import { fencingTokenVerified, type Headerish, header, lookupProblem, secretKey } from "./contract.js";

export const LIBRARY_TOLERANCE_S = 300;

export class SignatureVerifier {
  private readonly webhooks: Webhook[];
  private readonly keys: Buffer[];

  constructor(
    secrets: readonly string[],
    readonly toleranceS: number = LIBRARY_TOLERANCE_S,
  ) {
    if (secrets.length === 0) throw new Error("the receiver needs at least one webhook secret (whsec_...)");
    if (!(toleranceS > 0 && toleranceS <= LIBRARY_TOLERANCE_S)) {
      throw new Error(`toleranceS must be above 0 and at most ${LIBRARY_TOLERANCE_S}`);
    }
    this.keys = secrets.map((secret, n) => {
      try {
        return secretKey(secret);
      } catch (error) {
        throw new Error((error as Error).message.replace("webhook secret", `webhook secret #${n + 1}`));
      }
    });
    this.webhooks = secrets.map((secret) => new Webhook(secret));
  }

  /** Undefined if the request is authentic and fresh; else why not (one line, no secret). */
  problem(headers: Headerish, body: Buffer, now: number): string | undefined {
    const id = header(headers, "webhook-id");
    const timestamp = header(headers, "webhook-timestamp");
    const signatures = header(headers, "webhook-signature");
    if (!id || !timestamp || !signatures) return "missing webhook-id, webhook-timestamp or webhook-signature header";
    if (!/^-?[0-9]+$/.test(timestamp)) return "webhook-timestamp is not an integer (unix seconds)";
    const away = Math.abs(now - Number(timestamp));
    if (away > this.toleranceS) {
      return (
        `webhook-timestamp ${timestamp} is ${away.toFixed(0)}s away from now, outside the ` +
        `${this.toleranceS.toFixed(0)}s tolerance (check the sender's clock)`
      );
    }
    const wanted = { "webhook-id": id, "webhook-timestamp": timestamp, "webhook-signature": signatures };
    for (const webhook of this.webhooks) {
      try {
        webhook.verify(body, wanted, { jsonParse: false });
        return undefined;
      } catch (error) {
        if (error instanceof WebhookVerificationError) continue;
        return "webhook-signature or body is malformed";
      }
    }
    return signatureHeaderProblem(signatures) ?? "no v1 signature matches any of the receiver's secrets";
  }

  /** True if `fencing-token-signature` binds `token` to the (verified) request. */
  tokenVerified(headers: Headerish, token: bigint): boolean {
    return fencingTokenVerified(this.keys, headers, token);
  }

  /** Undefined if the lookup of `key` is signed with one of our secrets and fresh. */
  lookupProblem(headers: Headerish, key: string, now: number): string | undefined {
    return lookupProblem(this.keys, headers, key, now, this.toleranceS);
  }
}

/** Why a `webhook-signature` header is not space-separated `version,base64` entries. */
export function signatureHeaderProblem(signatures: string): string | undefined {
  for (const entry of signatures.split(" ")) {
    const comma = entry.indexOf(",");
    if (comma <= 0 || comma === entry.length - 1) {
      return "webhook-signature is malformed: an entry is not 'version,signature'";
    }
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(entry.slice(comma + 1))) {
      return "webhook-signature is malformed: a signature is not base64";
    }
  }
  return undefined;
}
