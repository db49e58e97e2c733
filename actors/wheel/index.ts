export { HashedWheel, type WheelOptions, type WheelRef } from "./hashed-wheel.ts";
