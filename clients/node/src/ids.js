'use strict';
/**
 * Plan ids: checkpointd names every plan by a ULID (26 Crockford base32 characters), which the
 * caller chooses. Made here without a ULID package.
 */

const { randomBytes } = require('node:crypto');

const CROCKFORD_BASE32 = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';
const RANDOM_BITS = 80n;
const TIMESTAMP_MASK = (1n << 48n) - 1n;

/**
 * A fresh ULID for a new plan: the current time in milliseconds, then 80 random bits, so ids sort
 * by creation time and never collide in practice (`checkpointd new-plan-id` prints one too).
 * @returns {string}
 */
function newPlanId() {
  const random = BigInt(`0x${randomBytes(10).toString('hex')}`);
  let value = ((BigInt(Date.now()) & TIMESTAMP_MASK) << RANDOM_BITS) | random;
  // 26 characters of 5 bits hold 130 bits: the first carries the top 3, so it is 0-7.
  const chars = new Array(26);
  for (let i = 25; i >= 0; i -= 1) {
    chars[i] = CROCKFORD_BASE32[Number(value & 31n)];
    value >>= 5n;
  }
  return chars.join('');
}

module.exports = { newPlanId };
